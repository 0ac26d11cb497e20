using System;
using System.Collections.Generic;
using System.Threading.Tasks;
using Mythic.Client;

namespace Mythic.Samples
{
    /// <summary>The first NPC line, a tool handler and lip-sync, as docs/engines/unity.md shows
    /// them (its code blocks are the marked regions here). Plain C#: FirstNpcBehaviour runs it in
    /// a scene, and the SDK's tests run it against a real <c>mythic serve</c>.</summary>
    public static class FirstNpc
    {
        /// <summary>Connects, says the first line, prints the reply as it streams, and closes.</summary>
        public static async Task<string> RunAsync(string url, Action<string> show)
        {
            // --8<-- [start:connect]
            var client = new MythicClient(url, new MythicClientOptions
            {
                PlayerId = "player-1",
                ToolHandler = SetWaypoint,
            });
            var welcome = await client.ConnectAsync();
            // --8<-- [end:connect]
            show("session " + welcome.SessionId);
            try
            {
                LipSync(client);
                return await FirstLineAsync(client, show);
            }
            finally
            {
                await client.CloseAsync();
            }
        }

        // --8<-- [start:tool-handler]
        /// <summary>The game's tools: the NPC asks, the game acts and answers; the NPC voices the
        /// answer in the same turn. The client runs this once per call (a repeat is acked
        /// duplicate).</summary>
        public static Task<ToolResult> SetWaypoint(ToolCall call)
        {
            if (call.Name != "set_waypoint")
                return Task.FromResult(ToolResult.Rejected("this game has no " + call.Name));
            var target = (string)call.Args["target"];
            // In Unity this runs on the main thread (MythicConnection passes its context):
            // move the quest marker to `target` here.
            return Task.FromResult(ToolResult.Ok(new Dictionary<string, object> { { "waypoint", target } }));
        }
        // --8<-- [end:tool-handler]

        /// <summary>Says one line to Marla and shows her reply piece by piece.</summary>
        public static async Task<string> FirstLineAsync(MythicClient client, Action<string> show)
        {
            // --8<-- [start:first-line]
            var turn = await client.SayAsync("marla", "Good evening! Is the tavern open tonight?");
            ITurnEvent e;
            while ((e = await turn.NextAsync()) != null)
            {
                var delta = e as LlmStreamDelta;
                if (delta != null && !string.IsNullOrEmpty(delta.Delta))
                    show(delta.Delta); // a subtitle, as the words come
            }
            // turn.Text is the whole reply; turn.FinishReason says why it ended.
            // --8<-- [end:first-line]
            return turn.Text;
        }

        /// <summary>Marla's voice and mouth: what NPCSpeaker does with an AudioSource and a face.</summary>
        public static SpeechPlayback LipSync(MythicClient client)
        {
            // --8<-- [start:lip-sync]
            var playback = new SpeechPlayback(BlendShapeMap.OculusVisemes("viseme_"), "marla", 48000);
            client.Speech += playback.Add; // each TTSChunk: PCM and visemes
            client.CutoffReceived += cutoff => playback.Stop(); // the player interrupted
            // On the audio thread: playback.Read(data, channels) fills the output buffer.
            // Each frame: playback.MouthWeights(weights) gives one weight (0-1) per blend shape
            // of playback's map, at the sample being heard.
            // --8<-- [end:lip-sync]
            return playback;
        }
    }
}
