using System;
using System.Collections.Generic;
using System.Threading.Tasks;
using Mythic.Client;

namespace Mythic.Samples
{
    /// <summary>A tavern scene, as docs/engines/unity.md shows it (its code block is the marked
    /// region here): the barkeep, a guard and a vampire noble at one table, the player's lines
    /// answered by the NPC they name or face, an NPC walking out and back in, the NPCs talking
    /// among themselves. Plain C#: the SDK's tests run it against a real <c>mythic serve</c>.</summary>
    public static class Tavern
    {
        /// <summary>Plays the scene, showing each reply with who says it; the scene's talks, in order.</summary>
        public static async Task<List<SceneTalk>> RunAsync(string url, Action<string> show)
        {
            var client = new MythicClient(url, new MythicClientOptions { PlayerId = "tavern-guest" });
            await client.ConnectAsync();
            try
            {
                // --8<-- [start:tavern]
                var talks = new List<SceneTalk>();
                var scene = await client.StartSceneAsync("tavern", new[] { "marla", "captain_strand", "countess_isolde" });
                talks.Add(await ShowAsync(await scene.SayAsync("Captain Strand, when does the curfew begin?"), show)); // the NPC named answers
                talks.Add(await ShowAsync(await scene.SayAsync("What will you drink tonight?", to: "countess_isolde"), show)); // the one faced
                await scene.LeaveAsync("captain_strand"); // she walks out: she hears nothing more
                talks.Add(await ShowAsync(await scene.AmbientAsync(4, topic: "the fog tonight", opener: "marla"), show));
                await scene.JoinAsync("captain_strand"); // back: she hears what follows
                talks.Add(await ShowAsync(await scene.SayAsync("Marla, one more ale before I go."), show));
                await scene.EndAsync("the player left the tavern");
                // --8<-- [end:tavern]
                return talks;
            }
            finally
            {
                await client.CloseAsync();
            }
        }

        /// <summary>Shows each reply of a line as it streams: who answers, then their words.</summary>
        public static async Task<SceneTalk> ShowAsync(SceneTalk talk, Action<string> show)
        {
            object e;
            while ((e = await talk.NextAsync()) != null)
            {
                var turn = e as SceneTurn;
                if (turn != null && turn.Speakers.Count > 0)
                    show(string.Join(", ", turn.Speakers) + ":");
                var delta = e as LlmStreamDelta;
                if (delta != null && !string.IsNullOrEmpty(delta.Delta))
                    show(delta.Delta);
            }
            return talk;
        }
    }
}
