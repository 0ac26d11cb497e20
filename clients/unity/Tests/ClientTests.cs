using System;
using System.Collections.Generic;
using System.Linq;
using System.Threading;
using System.Threading.Tasks;
using Newtonsoft.Json.Linq;
using NUnit.Framework;

namespace Mythic.Client.Tests
{
    /// <summary>The client against a scripted peer (a real WebSocket on loopback whose frames the
    /// test writes): what a real server cannot be made to do on purpose (a newer schema, an
    /// unknown message type, a drop at an exact point, a silence).</summary>
    [TestFixture]
    public class ClientTests
    {
        private static JObject Delta(string turn, int seq, string text, bool final = false, string finish = null)
        {
            var delta = new JObject
            {
                { "schema_version", "v1" }, { "type", "LLMStreamDelta" }, { "npc_id", "marla" }, { "session_id", "s-1" },
                { "turn_id", turn }, { "seq", seq }, { "delta", text }, { "final", final },
            };
            if (finish != null)
                delta["finish_reason"] = finish;
            return delta;
        }

        private static MythicClient Client(ScriptedPeer peer, MythicClientOptions options = null)
        {
            options = options ?? new MythicClientOptions();
            options.Timeout = options.Timeout == TimeSpan.FromSeconds(30) ? TimeSpan.FromSeconds(5) : options.Timeout;
            options.Backoff = TimeSpan.FromMilliseconds(10);
            return new MythicClient(peer.Url, options);
        }

        private static async Task<Tuple<MythicClient, PeerConnection>> ConnectedAsync(ScriptedPeer peer, MythicClientOptions options = null)
        {
            var client = Client(peer, options);
            var welcoming = peer.WelcomeAsync();
            var welcome = await client.ConnectAsync();
            Assert.AreEqual("s-1", welcome.SessionId);
            return Tuple.Create(client, await welcoming);
        }

        /// <summary>The peer answers the client's close (as a server does) while it closes.</summary>
        private static async Task CloseBothAsync(Task closing, PeerConnection server)
        {
            while ((await server.ReceiveFrameAsync()).Item1 != 8) { }
            await closing;
        }

        [Test]
        public async Task A_line_streams_as_the_turns_events_and_ends_with_its_finish_reason()
        {
            using (var peer = new ScriptedPeer())
            {
                var both = await ConnectedAsync(peer, new MythicClientOptions { PlayerId = "p-1" });
                var client = both.Item1;
                var server = both.Item2;
                Assert.AreEqual("SessionStart", (string)server.Start["type"]);
                Assert.AreEqual("p-1", (string)server.Start["player_id"]);
                var turn = await client.SayAsync("marla", "Hello", "t-1");
                var said = await server.ReceiveAsync();
                Assert.AreEqual("PlayerUtterance", (string)said["type"]);
                Assert.AreEqual("s-1", (string)said["session_id"]);
                Assert.AreEqual("Hello", (string)said["text"]);
                await server.SendAsync(Delta("t-1", 0, "Good "));
                await server.SendAsync(Delta("t-1", 1, "evening."));
                await server.SendAsync(Delta("t-1", 2, "", true, "stop"));
                var pieces = new List<string>();
                var stream = turn.TextStream().GetAsyncEnumerator();
                while (await stream.MoveNextAsync())
                    pieces.Add(stream.Current);
                CollectionAssert.AreEqual(new[] { "Good ", "evening." }, pieces);
                Assert.AreEqual("Good evening.", turn.Text);
                Assert.AreEqual(FinishReason.Stop, turn.FinishReason);
                Assert.IsTrue(turn.Over);
                Assert.IsNull(await turn.NextAsync());
                var closing = client.CloseAsync();
                Assert.AreEqual("SessionEnd", (string)(await server.ReceiveAsync())["type"]);
                await CloseBothAsync(closing, server);
            }
        }

        [Test]
        public async Task Frames_the_client_cannot_read_are_reported_and_the_session_goes_on()
        {
            using (var peer = new ScriptedPeer())
            {
                var both = await ConnectedAsync(peer);
                var client = both.Item1;
                var server = both.Item2;
                var reported = new List<object>();
                client.Event += e => { lock (reported) reported.Add(e); };
                await server.SendTextAsync("{\"schema_version\": \"v1\", \"type\": \"Teleport\"}");
                await server.SendTextAsync("{\"schema_version\": \"v2\", \"type\": \"NPCState\"}");
                await server.SendTextAsync("{not json");
                await server.SendTextAsync("[1]");
                await server.SendAsync(new JObject { { "schema_version", "v1" }, { "type", "NPCState" }, { "npc_id", "marla" }, { "state", "dancing" } });
                await server.SendBinaryAsync(new byte[] { 1, 2, 3, 4, 5, 6, 7, 8, 9 });
                var codes = new List<string>();
                for (var i = 0; i < 6; i++)
                {
                    var e = await client.NextEventAsync();
                    Assert.IsInstanceOf<ProtocolException>(e);
                    codes.Add(((ProtocolException)e).Code);
                }
                CollectionAssert.AreEqual(new[] { "unknown_type", "bad_schema_version", "bad_json", "not_an_object", "invalid_message", "bad_audio_frame" }, codes);
                var turn = await client.SayAsync("marla", "Still there?", "t-2");
                await server.SendAsync(Delta("t-2", 0, "Aye.", true, "stop"));
                Assert.AreEqual("Aye.", await turn.ReplyAsync());
                lock (reported) // raised on the socket's thread, in order: all six before the reply
                    Assert.AreEqual(6, reported.Count);
                await CloseBothAsync(client.CloseAsync(), server);
            }
        }

        [Test]
        public async Task A_newer_schema_version_is_named_in_the_error()
        {
            using (var peer = new ScriptedPeer())
            {
                var both = await ConnectedAsync(peer);
                await both.Item2.SendTextAsync("{\"schema_version\": \"v2\", \"type\": \"LLMStreamDelta\"}");
                var e = (ProtocolException)await both.Item1.NextEventAsync();
                StringAssert.Contains("\"v2\"", e.Message);
                StringAssert.Contains("this client v1", e.Message);
                Assert.AreEqual("schema_version", e.Ref);
                await CloseBothAsync(both.Item1.CloseAsync(), both.Item2);
            }
        }

        [Test]
        public async Task What_breaks_the_schema_is_refused_in_the_client_and_never_sent()
        {
            using (var peer = new ScriptedPeer())
            {
                var both = await ConnectedAsync(peer);
                var client = both.Item1;
                var e = Assert.Throws<ValidationException>(() => client.SayAsync("marla", "", "t-1").GetAwaiter().GetResult());
                Assert.AreEqual("PlayerUtterance.text", e.Ref);
                e = Assert.Throws<ValidationException>(() => client.SceneAsync("marla", time: "25:00").GetAwaiter().GetResult());
                Assert.AreEqual("SceneUpdate.time", e.Ref);
                e = Assert.Throws<ValidationException>(() => client.SendAsync(JObject.Parse("{\"type\": \"Welcome\"}")).GetAwaiter().GetResult());
                Assert.AreEqual("type", e.Ref);
                await client.SayAsync("marla", "Hello", "t-2");
                Assert.AreEqual("t-2", (string)(await both.Item2.ReceiveAsync())["turn_id"], "the refused messages never reached the peer");
                await CloseBothAsync(client.CloseAsync(), both.Item2);
            }
        }

        [Test]
        public async Task A_server_error_of_a_turn_ends_it_and_one_at_connect_throws_typed()
        {
            using (var peer = new ScriptedPeer())
            {
                var both = await ConnectedAsync(peer);
                var turn = await both.Item1.SayAsync("nobody", "Hello?", "t-1");
                await both.Item2.SendAsync(new JObject
                {
                    { "schema_version", "v1" }, { "type", "Error" }, { "code", "unknown_npc" }, { "message", "no NPC nobody" }, { "turn_id", "t-1" },
                });
                await both.Item2.SendAsync(Delta("t-1", 0, "", true, "error"));
                await turn.ReplyAsync();
                Assert.AreEqual("unknown_npc", turn.Errors.Single().Code);
                Assert.AreEqual(FinishReason.Error, turn.FinishReason);
                await CloseBothAsync(both.Item1.CloseAsync(), both.Item2);

                var refused = Client(peer);
                var serving = Task.Run(async () =>
                {
                    var server = await peer.AcceptAsync();
                    await server.ReceiveAsync();
                    await server.SendAsync(new JObject
                    {
                        { "schema_version", "v1" }, { "type", "Error" }, { "code", "unknown_session" }, { "message", "no such session" }, { "ref", "SessionStart" },
                    });
                });
                var e = Assert.Throws<ServerException>(() => refused.ConnectAsync().GetAwaiter().GetResult());
                Assert.AreEqual("unknown_session", e.Code);
                Assert.AreEqual("SessionStart", e.Ref);
                await serving;
            }
        }

        [Test]
        public async Task The_tool_handler_runs_once_per_call_and_a_repeat_is_acked_duplicate()
        {
            using (var peer = new ScriptedPeer())
            {
                var runs = 0;
                var options = new MythicClientOptions
                {
                    ToolHandler = _ =>
                    {
                        Interlocked.Increment(ref runs);
                        return Task.FromResult(ToolResult.Ok(new Dictionary<string, object> { { "distance_m", 140 } }));
                    },
                };
                var both = await ConnectedAsync(peer, options);
                var server = both.Item2;
                var turn = await both.Item1.SayAsync("marla", "Which way?", "t-1");
                await server.ReceiveAsync();
                var call = new JObject
                {
                    { "schema_version", "v1" }, { "type", "ToolCall" }, { "npc_id", "marla" }, { "turn_id", "t-1" },
                    { "call_id", "c-1" }, { "name", "set_waypoint" }, { "args", new JObject { { "target", "blackfen_marsh" } } },
                };
                await server.SendAsync(call);
                var first = await server.ReceiveAsync();
                await server.SendAsync(call);
                var again = await server.ReceiveAsync();
                Assert.AreEqual(1, runs);
                Assert.AreEqual("ok", (string)first["status"]);
                Assert.AreEqual(140, (int)first["result"]["distance_m"]);
                Assert.AreEqual("duplicate", (string)again["status"]);
                Assert.AreEqual("c-1", (string)again["call_id"]);
                Assert.AreEqual(140, (int)again["result"]["distance_m"]);
                await server.SendAsync(Delta("t-1", 0, "", true, "stop"));
                await turn.ReplyAsync();
                Assert.AreEqual("blackfen_marsh", (string)turn.ToolCalls[0].Args["target"]);
                await CloseBothAsync(both.Item1.CloseAsync(), both.Item2);
            }
        }

        [Test]
        public async Task A_handler_that_throws_is_acked_error_with_its_message()
        {
            using (var peer = new ScriptedPeer())
            {
                var options = new MythicClientOptions { ToolHandler = call => { throw new InvalidOperationException("the gate is locked"); } };
                var both = await ConnectedAsync(peer, options);
                await both.Item2.SendAsync(new JObject
                {
                    { "schema_version", "v1" }, { "type", "ToolCall" }, { "npc_id", "marla" }, { "turn_id", "t-1" },
                    { "call_id", "c-1" }, { "name", "open_gate" }, { "args", new JObject() },
                });
                var ack = await both.Item2.ReceiveAsync();
                Assert.AreEqual("error", (string)ack["status"]);
                Assert.AreEqual("the gate is locked", (string)ack["message"]);
                await CloseBothAsync(both.Item1.CloseAsync(), both.Item2);
            }
        }

        [Test]
        public async Task A_drop_mid_turn_ends_the_turn_lost_and_the_session_resumes()
        {
            using (var peer = new ScriptedPeer())
            {
                var both = await ConnectedAsync(peer);
                var client = both.Item1;
                var turn = await client.SayAsync("marla", "Tell me a long story", "t-1");
                await both.Item2.ReceiveAsync();
                await both.Item2.SendAsync(Delta("t-1", 0, "Once"));
                Assert.IsInstanceOf<LlmStreamDelta>(await turn.NextAsync());
                var resuming = peer.WelcomeAsync("s-1", true);
                both.Item2.Drop();
                Assert.Throws<ConnectionLostException>(() => turn.NextAsync().GetAwaiter().GetResult());
                var again = await resuming;
                Assert.AreEqual("s-1", (string)again.Start["session_id"]);
                Assert.AreEqual("r-s-1", (string)again.Start["resume_token"]);
                var deadline = DateTime.UtcNow + ScriptedPeer.Wait;
                while (client.Resumes < 1 || !client.IsConnected)
                {
                    Assert.Less(DateTime.UtcNow, deadline, "the client did not resume");
                    await Task.Delay(10);
                }
                var next = await client.SayAsync("marla", "Go on", "t-2");
                Assert.AreEqual("t-2", (string)(await again.ReceiveAsync())["turn_id"]);
                await again.SendAsync(Delta("t-2", 0, "Aye.", true, "stop"));
                Assert.AreEqual("Aye.", await next.ReplyAsync());
                await CloseBothAsync(client.CloseAsync(), again);
            }
        }

        [Test]
        public async Task Every_wait_is_bounded()
        {
            using (var peer = new ScriptedPeer())
            {
                var options = new MythicClientOptions { Timeout = TimeSpan.FromMilliseconds(500) };
                var silent = Client(peer, options);
                var accepting = peer.AcceptAsync();
                Assert.Throws<WaitTimeoutException>(() => silent.ConnectAsync().GetAwaiter().GetResult(), "no Welcome");
                (await accepting).Dispose();

                var both = await ConnectedAsync(peer, new MythicClientOptions { Timeout = TimeSpan.FromMilliseconds(500) });
                var turn = await both.Item1.SayAsync("marla", "Hello?", "t-1");
                Assert.Throws<WaitTimeoutException>(() => turn.NextAsync().GetAwaiter().GetResult(), "a silent turn");
                Assert.IsTrue(turn.Over);
                Assert.Throws<WaitTimeoutException>(() => both.Item1.IntentAsync("marla").GetAwaiter().GetResult(), "an unanswered intent");
                Assert.Throws<WaitTimeoutException>(() => both.Item1.NextEventAsync().GetAwaiter().GetResult(), "no event");
                both.Item1.Dispose();
            }
        }

        [Test]
        public async Task The_client_gives_up_reconnecting_after_its_tries_and_says_so()
        {
            var peer = new ScriptedPeer();
            var both = await ConnectedAsync(peer, new MythicClientOptions { MaxReconnects = 2 });
            peer.Dispose(); // nobody listens any more
            both.Item2.Drop();
            var e = await both.Item1.NextEventAsync();
            Assert.IsInstanceOf<ConnectionLostException>(e);
            StringAssert.Contains("after 2 tries", ((ConnectionLostException)e).Message);
            Assert.IsFalse(both.Item1.IsConnected);
        }

        [Test]
        public async Task Intents_are_answered_by_request_id()
        {
            using (var peer = new ScriptedPeer())
            {
                var both = await ConnectedAsync(peer);
                var asking = both.Item1.IntentAsync("grisk", "the player drew a sword", true, "i-1");
                var request = await both.Item2.ReceiveAsync();
                Assert.AreEqual("IntentRequest", (string)request["type"]);
                Assert.AreEqual(true, (bool)request["with_bark"]);
                await both.Item2.SendAsync(new JObject
                {
                    { "schema_version", "v1" }, { "type", "IntentUpdate" }, { "npc_id", "grisk" }, { "request_id", "i-1" },
                    { "intent", "combat" }, { "target", "player" }, { "bark", "Die, fool!" },
                });
                var update = await asking;
                Assert.AreEqual(Intent.Combat, update.Intent);
                Assert.AreEqual("Die, fool!", update.Bark);
                await CloseBothAsync(both.Item1.CloseAsync(), both.Item2);
            }
        }

        [Test]
        public async Task Audio_goes_out_and_comes_in_as_MYA1_frames()
        {
            using (var peer = new ScriptedPeer())
            {
                var options = new MythicClientOptions { Voice = new VoiceFormat { Binary = true } };
                var both = await ConnectedAsync(peer, options);
                Assert.AreEqual(true, (bool)both.Item2.Start["voice"]["binary"]);
                var pcm = new byte[] { 1, 0, 2, 0, 255, 255 };
                await both.Item1.SendAudioAsync("marla", pcm, end: true);
                var frame = await both.Item2.ReceiveFrameAsync();
                Assert.AreEqual(2, frame.Item1);
                var bytes = frame.Item2;
                CollectionAssert.AreEqual(Protocol.AudioFrameMagic, bytes.Take(4));
                var size = BitConverter.ToInt32(bytes, 4);
                var header = JObject.Parse(System.Text.Encoding.UTF8.GetString(bytes, 8, size));
                Assert.AreEqual("AudioChunk", (string)header["type"]);
                Assert.AreEqual(16000, (int)header["sample_rate"]);
                Assert.AreEqual(true, (bool)header["end"]);
                Assert.IsNull(header["pcm"]);
                CollectionAssert.AreEqual(pcm, bytes.Skip(8 + size));
                Assert.Throws<ValidationException>(() => both.Item1.SendAudioAsync("marla", new byte[] { 1, 2, 3 }).GetAwaiter().GetResult());

                var heard = new TaskCompletionSource<TtsChunk>();
                both.Item1.Speech += c => heard.TrySetResult(c);
                var chunk = new JObject
                {
                    { "schema_version", "v1" }, { "type", "TTSChunk" }, { "npc_id", "marla" }, { "session_id", "s-1" }, { "turn_id", "t-1" },
                    { "seq", 0 }, { "sample_rate", 22050 }, { "visemes", JArray.Parse("[{\"t\": 0.0, \"p\": \"sil\"}, {\"t\": 0.02, \"p\": \"aa\"}]") },
                };
                await both.Item2.SendBinaryAsync(Protocol.EncodeAudioFrame(chunk, pcm));
                var got = await MythicClient.Bounded(heard.Task, ScriptedPeer.Wait, "speech");
                CollectionAssert.AreEqual(pcm, got.PcmBytes);
                Assert.AreEqual("aa", got.Visemes[1].P);
                await CloseBothAsync(both.Item1.CloseAsync(), both.Item2);
            }
        }
    }
}
