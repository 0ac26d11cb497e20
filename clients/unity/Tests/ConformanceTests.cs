using System;
using System.Collections.Generic;
using System.IO;
using System.Linq;
using System.Net.WebSockets;
using System.Text;
using System.Threading;
using System.Threading.Tasks;
using Newtonsoft.Json.Linq;
using NUnit.Framework;

namespace Mythic.Client.Tests
{
    /// <summary>The conformance suite (clients/conformance/scenarios) played through this SDK's
    /// public API against a real <c>mythic serve</c>: MYTHIC_URL is its WebSocket URL,
    /// MYTHIC_CONFORMANCE_DIR the scenarios, MYTHIC_CONFORMANCE_AUDIO the folder of the audio clips
    /// <c>talk</c> steps speak (tests/integration/test_sdk_csharp.py sets all three).</summary>
    [TestFixture]
    public class ConformanceTests
    {
        internal static readonly TimeSpan WaitS = TimeSpan.FromSeconds(120);

        internal static string Url => Environment.GetEnvironmentVariable("MYTHIC_URL");

        public static IEnumerable<string> Scenarios()
        {
            var dir = Environment.GetEnvironmentVariable("MYTHIC_CONFORMANCE_DIR") ?? "../../conformance/scenarios";
            return Directory.Exists(dir) ? Directory.GetFiles(dir, "*.json").OrderBy(f => f, StringComparer.Ordinal) : Enumerable.Empty<string>();
        }

        [Test]
        public void The_suite_holds_scenarios()
        {
            Assert.GreaterOrEqual(Scenarios().Count(), 10, "set MYTHIC_CONFORMANCE_DIR to clients/conformance/scenarios");
        }

        [TestCaseSource("Scenarios")]
        public async Task Conformance(string path)
        {
            if (Url == null)
                Assert.Ignore("set MYTHIC_URL to a running `mythic serve` (see clients/conformance/README.md)");
            var scenario = JObject.Parse(File.ReadAllText(path));
            Assert.AreEqual(Path.GetFileNameWithoutExtension(path), (string)scenario["name"], "a scenario is named after its file");
            await new Player(Url, (string)scenario["name"]).PlayAsync((JArray)scenario["steps"]);
        }
    }

    /// <summary>One turn of a scenario: its SDK turn, the events read so far, how it ended.</summary>
    internal sealed class TurnLog
    {
        internal TurnLog(Turn turn)
        {
            Turn = turn;
        }

        internal Turn Turn { get; }

        internal List<ITurnEvent> Events { get; } = new List<ITurnEvent>();

        internal bool Lost { get; private set; }

        internal async Task ReadAsync(string until)
        {
            while (!Turn.Over)
            {
                ITurnEvent e;
                try
                {
                    e = await Turn.NextAsync();
                }
                catch (ConnectionLostException)
                {
                    Lost = true;
                    return;
                }
                if (e == null)
                    return;
                Events.Add(e);
                var delta = e as LlmStreamDelta;
                if (until == "text" && delta != null && !string.IsNullOrEmpty(delta.Delta))
                    return;
            }
        }
    }

    /// <summary>One spoken turn of a scenario (a <c>talk</c> step): what the SDK delivered for its
    /// turn id, in order. A spoken turn has no <see cref="Turn"/>: its ASRFinal, deltas, TTSChunks,
    /// tool calls, Cutoffs and errors come as the client's events (<see cref="MythicClient.Event"/>),
    /// raised on the socket's thread.</summary>
    internal sealed class SpokenLog
    {
        private readonly List<IServerMessage> _messages = new List<IServerMessage>();
        private readonly TaskCompletionSource<bool> _replied = new TaskCompletionSource<bool>(TaskCreationOptions.RunContinuationsAsynchronously);
        private readonly TaskCompletionSource<bool> _spoken = new TaskCompletionSource<bool>(TaskCreationOptions.RunContinuationsAsynchronously);

        /// <summary>Done when the reply's text is complete (its final delta that is not
        /// <c>tool_call</c>), or the NPC was cut off.</summary>
        internal Task Replied => _replied.Task;

        /// <summary>Done when the reply's last TTSChunk came, or the NPC was cut off, or the reply
        /// ended in a cutoff or an error (nothing more will be spoken).</summary>
        internal Task Spoken => _spoken.Task;

        /// <summary>What came so far, in order.</summary>
        internal List<IServerMessage> Messages
        {
            get
            {
                lock (_messages)
                    return _messages.ToList();
            }
        }

        internal void Add(IServerMessage message)
        {
            lock (_messages)
                _messages.Add(message);
            var delta = message as LlmStreamDelta;
            if (delta != null && delta.Final == true && delta.FinishReason != FinishReason.ToolCall)
            {
                _replied.TrySetResult(true);
                if (delta.FinishReason == FinishReason.Cutoff || delta.FinishReason == FinishReason.Error)
                    _spoken.TrySetResult(true);
            }
            var chunk = message as TtsChunk;
            if (chunk != null && chunk.Final == true)
                _spoken.TrySetResult(true);
            if (message is Cutoff)
            {
                _replied.TrySetResult(true);
                _spoken.TrySetResult(true);
            }
        }

        /// <summary>The turn's id, for the messages a spoken turn is made of; null for others.</summary>
        internal static string TurnOf(IServerMessage message)
        {
            if (message is AsrFinal)
                return ((AsrFinal)message).TurnId;
            if (message is TtsChunk)
                return ((TtsChunk)message).TurnId;
            if (message is LlmStreamDelta)
                return ((LlmStreamDelta)message).TurnId;
            if (message is ToolCall)
                return ((ToolCall)message).TurnId;
            if (message is Cutoff)
                return ((Cutoff)message).TurnId;
            if (message is Error)
                return ((Error)message).TurnId;
            return null;
        }

        /// <summary>The messages, short: a TTSChunk's PCM as its length.</summary>
        internal string Describe()
        {
            var seen = string.Join(" | ", Messages.Select(m =>
            {
                var chunk = m as TtsChunk;
                if (chunk == null)
                    return Protocol.ToJson(m).ToString(Newtonsoft.Json.Formatting.None);
                var visemes = chunk.Visemes ?? new List<Viseme>();
                return "TTSChunk seq " + chunk.Seq + (chunk.Final == true ? " final" : "") + ", " + chunk.PcmBytes.Length + " bytes at " + chunk.SampleRate + " Hz, visemes at ["
                    + string.Join(", ", visemes.Select(v => v.T.ToString("0.###", System.Globalization.CultureInfo.InvariantCulture))) + "]";
            }));
            return seen.Length > 4000 ? seen.Substring(0, 4000) : seen;
        }
    }

    /// <summary>Plays one scenario through <see cref="MythicClient"/>, step by step.</summary>
    internal sealed class Player
    {
        private readonly string _url;
        private readonly string _name;
        private readonly Dictionary<string, MythicClient> _clients = new Dictionary<string, MythicClient>();
        private readonly Dictionary<string, string> _sessions = new Dictionary<string, string>();
        private readonly Dictionary<string, ClientWebSocket> _bare = new Dictionary<string, ClientWebSocket>();
        private readonly Dictionary<string, TurnLog> _turns = new Dictionary<string, TurnLog>();
        private readonly Dictionary<string, SpokenLog> _spoken = new Dictionary<string, SpokenLog>();
        private readonly Dictionary<string, VoiceFormat> _voices = new Dictionary<string, VoiceFormat>();
        private readonly Dictionary<string, int> _toolRuns = new Dictionary<string, int>();
        private readonly Dictionary<string, Scene> _scenes = new Dictionary<string, Scene>();
        private readonly Dictionary<string, SceneTalk> _talks = new Dictionary<string, SceneTalk>();

        internal Player(string url, string name)
        {
            _url = url;
            _name = name;
        }

        internal async Task PlayAsync(JArray steps)
        {
            try
            {
                for (var n = 0; n < steps.Count; n++)
                {
                    var step = (JObject)steps[n];
                    var who = (string)step["client"] ?? "main";
                    var bound = step["timeout_s"] != null ? TimeSpan.FromSeconds((double)step["timeout_s"]) : ConformanceTests.WaitS;
                    try
                    {
                        await MythicClient.Bounded(StepAsync((string)step["do"], step, who), bound, "end of the step");
                    }
                    catch (Exception e) when (e is AssertionException || e is MythicException)
                    {
                        throw new AssertionException(_name + " step " + n + " " + step.ToString(Newtonsoft.Json.Formatting.None) + ": " + e.Message + Seen(step), e);
                    }
                }
            }
            finally
            {
                foreach (var client in _clients.Values)
                    await client.CloseAsync();
                foreach (var ws in _bare.Values)
                    ws.Abort();
            }
        }

        private Task StepAsync(string action, JObject step, string who)
        {
            switch (action)
            {
                case "connect": return ConnectAsync(step, who);
                case "disconnect": return Client(who).DisconnectAsync();
                case "drop": return DropAsync(who);
                case "wait_resumed": return WaitResumedAsync(step, who);
                case "close": return CloseAsync(who);
                case "open_bare": return OpenBareAsync(who);
                case "say": return SayAsync(step, who);
                case "read": return ReadAsync(step);
                case "talk": return TalkAsync(step, who);
                case "listen": return ListenAsync(step);
                case "cutoff": return _turns[(string)step["turn"]].Turn.CutoffAsync();
                case "scene": return SceneAsync(step, who);
                case "intent": return IntentAsync(step, who);
                case "scene_start": return SceneStartAsync(step, who);
                case "scene_say": return SceneSayAsync(step);
                case "scene_ambient": return SceneAmbientAsync(step);
                case "scene_read": return SceneReadAsync(step);
                case "scene_join": return SceneMembersAsync(step, _scenes[(string)step["scene"]].JoinAsync((string)step["npc"]));
                case "scene_leave": return SceneMembersAsync(step, _scenes[(string)step["scene"]].LeaveAsync((string)step["npc"]));
                case "scene_end": return SceneEndAsync(step);
                case "ack": return AckAsync(step, who);
                case "send": return SendAsync(step, who);
                case "send_raw": return SendRawAsync(step, who);
                case "expect_error": return ExpectErrorAsync(step, who);
                case "expect_closed": return ExpectClosedAsync(step, who);
                default: throw new AssertionException("unknown step " + action);
            }
        }

        private MythicClient Client(string who)
        {
            MythicClient client;
            Assert.IsTrue(_clients.TryGetValue(who, out client), "no client " + who);
            return client;
        }

        private JToken Fill(JToken value, string who)
        {
            MythicClient client;
            var session = _clients.TryGetValue(who, out client) ? client.SessionId : "";
            return Filled(value.DeepClone(), session);
        }

        /// <summary>The <c>$session_id</c> placeholder, replaced by the client's session id.</summary>
        private static JToken Filled(JToken token, string session)
        {
            if (token.Type == JTokenType.String)
                return new JValue(((string)token).Replace("$session_id", session));
            var container = token as JContainer;
            if (container != null)
            {
                foreach (var child in container.Children().ToList())
                {
                    var property = child as JProperty;
                    if (property != null)
                        property.Value = Filled(property.Value, session);
                    else
                        child.Replace(Filled(child, session));
                }
            }
            return token;
        }

        /// <summary>For a failed <c>listen</c>: what its turn delivered.</summary>
        private string Seen(JObject step)
        {
            SpokenLog log;
            if ((string)step["do"] != "listen" || !TrySpoken((string)step["turn"], out log))
                return "";
            return "\nthe turn delivered: " + log.Describe();
        }

        private bool TrySpoken(string turnId, out SpokenLog log)
        {
            lock (_spoken)
                return _spoken.TryGetValue(turnId ?? "", out log);
        }

        /// <summary>The client's events, on the socket's thread: a spoken turn's messages go to its
        /// log. They stay in the client's event queue too (the SDK hands them out there), for
        /// <c>expect_error</c> to skip.</summary>
        private void Hear(object e)
        {
            var message = e as IServerMessage;
            SpokenLog log;
            if (message != null && TrySpoken(SpokenLog.TurnOf(message), out log))
                log.Add(message);
        }

        private void Run(string turnId)
        {
            lock (_toolRuns)
                _toolRuns[turnId] = (_toolRuns.ContainsKey(turnId) ? _toolRuns[turnId] : 0) + 1;
        }

        // -- steps --------------------------------------------------------------------------------

        private async Task ConnectAsync(JObject step, string who)
        {
            MythicClient client;
            if (!_clients.TryGetValue(who, out client))
            {
                var tools = (JObject)step["tools"] ?? new JObject();
                var voice = step["voice"] == null ? null : step["voice"].ToObject<VoiceFormat>();
                client = new MythicClient(_url, new MythicClientOptions
                {
                    ToolHandler = async call =>
                    {
                        Run(call.TurnId);
                        var answer = (JObject)tools[call.Name];
                        if (answer == null)
                            return ToolResult.Rejected();
                        await Task.Delay(TimeSpan.FromSeconds((double?)answer["delay_s"] ?? 0)); // the game takes its time
                        var result = answer["result"] == null ? null : answer["result"].ToObject<Dictionary<string, object>>();
                        return new ToolResult((string)answer["status"] == "ok" ? Status.Ok : Status.Error, result);
                    },
                    Backoff = TimeSpan.FromMilliseconds(50),
                    Timeout = ConformanceTests.WaitS,
                    Voice = voice,
                });
                client.Event += Hear;
                _clients[who] = client;
                _voices[who] = voice;
            }
            var welcome = await client.ConnectAsync();
            var expect = (JObject)step["expect"] ?? new JObject();
            if (expect["resumed"] != null)
                Assert.AreEqual((bool)expect["resumed"], welcome.Resumed ?? false, "resumed");
            if ((bool?)expect["same_session"] == true)
                Assert.AreEqual(_sessions[who], welcome.SessionId, "the same session");
            _sessions[who] = welcome.SessionId;
        }

        private Task DropAsync(string who)
        {
            Client(who).Socket.Abort(); // the network drops: no close handshake
            return Task.FromResult(0);
        }

        private async Task WaitResumedAsync(JObject step, string who)
        {
            var client = Client(who);
            var resumes = (int)step["expect"]["resumes"];
            while (client.Resumes < resumes || !client.IsConnected)
                await Task.Delay(10);
            Assert.AreEqual(resumes, client.Resumes);
            if ((bool?)step["expect"]["same_session"] == true)
                Assert.AreEqual(_sessions[who], client.SessionId);
        }

        private async Task CloseAsync(string who)
        {
            ClientWebSocket ws;
            if (_bare.TryGetValue(who, out ws))
            {
                _bare.Remove(who);
                ws.Abort();
                return;
            }
            await Client(who).CloseAsync();
            _clients.Remove(who);
        }

        private async Task OpenBareAsync(string who)
        {
            var ws = new ClientWebSocket();
            await ws.ConnectAsync(new Uri(_url), CancellationToken.None);
            _bare[who] = ws;
        }

        private async Task SayAsync(JObject step, string who)
        {
            var turn = await Client(who).SayAsync((string)step["npc"], (string)step["text"], (string)step["turn"]);
            _turns[(string)step["turn"]] = new TurnLog(turn);
        }

        /// <summary>Speaks the clip through <see cref="MythicClient.SendAudioAsync"/>: the clip, then
        /// silence, in chunks of <c>chunk_ms</c>, each with the step's turn id, as fast as the
        /// socket takes them.</summary>
        private async Task TalkAsync(JObject step, string who)
        {
            var client = Client(who);
            var folder = Environment.GetEnvironmentVariable("MYTHIC_CONFORMANCE_AUDIO");
            Assert.IsNotNull(folder, "set MYTHIC_CONFORMANCE_AUDIO to the folder of the audio clips (see clients/conformance/README.md)");
            var pcm = File.ReadAllBytes(Path.Combine(folder, (string)step["audio"] + ".pcm"));
            VoiceFormat voice;
            _voices.TryGetValue(who, out voice);
            var rate = (int)((voice == null ? null : voice.InputRate) ?? 16000);
            var size = rate * ((int?)step["chunk_ms"] ?? 40) / 1000 * 2;
            var silence = new byte[rate * ((int?)step["silence_ms"] ?? 800) / 1000 * 2];
            var turnId = (string)step["turn"];
            var log = new SpokenLog();
            lock (_spoken)
                _spoken[turnId] = log; // before the first chunk: the server may answer at once
            foreach (var sound in new[] { pcm, silence })
            {
                for (var offset = 0; offset < sound.Length; offset += size)
                {
                    var chunk = new byte[Math.Min(size, sound.Length - offset)];
                    if (chunk.Length < 2)
                        continue;
                    Buffer.BlockCopy(sound, offset, chunk, 0, chunk.Length);
                    await client.SendAudioAsync((string)step["npc"], chunk, turnId: turnId);
                }
            }
        }

        /// <summary>Waits until the spoken turn is over (its reply, and the reply's last audio if it
        /// said anything), then checks it.</summary>
        private async Task ListenAsync(JObject step)
        {
            SpokenLog log;
            Assert.IsTrue(TrySpoken((string)step["turn"], out log), "no talk step for turn " + step["turn"]);
            await log.Replied;
            var text = string.Concat(log.Messages.OfType<LlmStreamDelta>().Select(d => d.Delta));
            if (text.Trim().Length > 0)
                await log.Spoken;
            CheckSpoken(log.Messages, (JObject)step["expect"] ?? new JObject());
        }

        private static void CheckSpoken(List<IServerMessage> messages, JObject expect)
        {
            var deltas = messages.OfType<LlmStreamDelta>().ToList();
            CollectionAssert.AreEqual(Enumerable.Range(0, deltas.Count).Select(i => (long)i), deltas.Select(d => d.Seq), "seq has gaps");
            if (expect["finish_reason"] != null)
            {
                var reason = deltas.Count == 0 || deltas[deltas.Count - 1].FinishReason == null ? null : Wire(deltas[deltas.Count - 1].FinishReason.Value);
                CollectionAssert.Contains(expect["finish_reason"].Select(r => (string)r).ToList(), reason, "finish_reason");
            }
            if ((bool?)expect["text"] == true)
                Assert.IsNotEmpty(string.Concat(deltas.Select(d => d.Delta)).Trim(), "text");
            if ((bool?)expect["heard"] == true)
            {
                var heard = messages.OfType<AsrFinal>().LastOrDefault();
                Assert.That(heard != null && !string.IsNullOrWhiteSpace(heard.Text), "heard: an ASRFinal with words");
            }
            if ((bool?)expect["audio"] == true)
                CheckAudio(messages.OfType<TtsChunk>().ToList());
        }

        /// <summary>The reply's audio: TTSChunks 0, 1, 2, ... with only the last final, each with
        /// whole samples at a rate, and visemes that run forward within each chunk and through the
        /// turn.</summary>
        private static void CheckAudio(List<TtsChunk> chunks)
        {
            CollectionAssert.AreEqual(Enumerable.Range(0, chunks.Count).Select(i => (long)i), chunks.Select(c => c.Seq), "TTSChunk seq has gaps");
            Assert.That(chunks.Count > 0 && chunks[chunks.Count - 1].Final == true, "the last TTSChunk is final");
            Assert.That(chunks.Take(chunks.Count - 1).All(c => c.Final != true), "only the last TTSChunk is final");
            var start = 0.0;
            var times = new List<double>(); // each viseme's time in the whole turn
            foreach (var chunk in chunks)
            {
                var pcm = chunk.PcmBytes;
                Assert.That(pcm.Length > 0 && pcm.Length % 2 == 0 && chunk.SampleRate > 0, "TTSChunk " + chunk.Seq + ": whole samples at a rate");
                var duration = pcm.Length / 2.0 / chunk.SampleRate;
                var visemes = (chunk.Visemes ?? new List<Viseme>()).Select(v => v.T).ToList();
                for (var i = 1; i < visemes.Count; i++)
                    Assert.That(visemes[i - 1] < visemes[i], "TTSChunk " + chunk.Seq + ": viseme times strictly increasing");
                Assert.That(visemes.All(t => t >= 0 && t <= duration), "TTSChunk " + chunk.Seq + ": viseme times within its " + duration + " s");
                times.AddRange(visemes.Select(t => start + t));
                start += duration;
            }
            Assert.That(times.Count > 0, "the turn has visemes");
            for (var i = 1; i < times.Count; i++)
                Assert.That(times[i - 1] <= times[i], "viseme times run forward through the turn");
        }

        private Task SceneAsync(JObject step, string who)
        {
            var objects = step["objects"] == null ? null : ((JObject)step["objects"]).Properties().ToDictionary(p => p.Name, p => (double)p.Value);
            return Client(who).SceneAsync((string)step["npc"], (string)step["zone"], (string)step["time"], objects);
        }

        private async Task SceneStartAsync(JObject step, string who)
        {
            var expect = (JObject)step["expect"] ?? new JObject();
            var start = Client(who).StartSceneAsync((string)step["scene"], step["npcs"].Select(n => (string)n), (long?)step["max_exchanges"]);
            if (expect["error"] != null)
            {
                ServerException refused = null;
                try
                {
                    await start;
                }
                catch (ServerException e)
                {
                    refused = e;
                }
                Assert.IsNotNull(refused, "the scene was not refused");
                foreach (var field in ((JObject)expect["error"]).Properties())
                    Assert.AreEqual((string)field.Value, (string)JObject.FromObject(refused.Error)[field.Name], field.Name);
                return;
            }
            var scene = await start;
            _scenes[(string)step["scene"]] = scene;
            if (expect["npcs"] != null)
                CollectionAssert.AreEqual(expect["npcs"].Select(n => (string)n), scene.Npcs, "npcs");
        }

        private async Task SceneSayAsync(JObject step)
        {
            var scene = _scenes[(string)step["scene"]];
            _talks[(string)step["turn"]] = await scene.SayAsync((string)step["text"], (string)step["to"], (string)step["turn"]);
        }

        private async Task SceneAmbientAsync(JObject step)
        {
            var scene = _scenes[(string)step["scene"]];
            var priority = (string)step["priority"] == "silver" ? Priority.Silver : Priority.Bronze;
            _talks[(string)step["turn"]] = await scene.AmbientAsync((int?)step["lines"] ?? 6, (string)step["topic"], (string)step["opener"], priority, (string)step["turn"]);
        }

        private async Task SceneReadAsync(JObject step)
        {
            var talk = await _talks[(string)step["turn"]].WaitAsync();
            var expect = (JObject)step["expect"] ?? new JObject();
            var replies = talk.Replies;
            var said = string.Join("; ", replies.Select(r => r.NpcId + ": " + r.Text + " (" + r.FinishReason + ")"));
            foreach (var reply in replies)
                CollectionAssert.AreEqual(Enumerable.Range(0, reply.Deltas.Count).Select(i => (long)i), reply.Deltas.Select(d => d.Seq), "seq has gaps");
            if (expect["speakers"] != null)
                CollectionAssert.AreEqual(expect["speakers"].Select(s => (string)s), talk.Speakers, "speakers: " + said);
            if (expect["first_speaker"] != null)
                CollectionAssert.AreEqual(new[] { (string)expect["first_speaker"] }, talk.Speakers.Take(1), "first speaker: " + said);
            if (expect["at_most"] != null)
                Assert.That(replies.Count <= (int)expect["at_most"], "at most " + expect["at_most"] + " replies: " + said);
            if (expect["chosen_by"] != null)
                Assert.AreEqual((string)expect["chosen_by"], talk.Turns.Count == 0 ? null : Wire(talk.Turns[0].ChosenBy), "chosen_by: " + said);
            if ((bool?)expect["text"] == true)
                Assert.That(replies.Count > 0 && replies[0].Text.Trim().Length > 0, "text: " + said);
            if (expect["finish_reason"] != null)
            {
                var allowed = expect["finish_reason"].Select(r => (string)r).ToList();
                Assert.That(replies.All(r => r.FinishReason != null && allowed.Contains(Wire(r.FinishReason.Value))), "finish_reason: " + said);
            }
            if (expect["errors"] != null)
                CollectionAssert.AreEqual(expect["errors"].Select(e => (string)e), talk.Errors.Select(e => e.Code), "errors");
        }

        private static async Task SceneMembersAsync(JObject step, Task<IReadOnlyList<string>> change)
        {
            var npcs = await change;
            var expect = (JObject)step["expect"] ?? new JObject();
            if (expect["npcs"] != null)
                CollectionAssert.AreEqual(expect["npcs"].Select(n => (string)n), npcs, "npcs");
        }

        private async Task SceneEndAsync(JObject step)
        {
            var scene = _scenes[(string)step["scene"]];
            await scene.EndAsync();
            Assert.IsNotNull(scene.Ended, "the scene ended");
        }

        private async Task IntentAsync(JObject step, string who)
        {
            var update = await Client(who).IntentAsync((string)step["npc"], (string)step["context"], (bool?)step["with_bark"] ?? false, (string)step["request_id"]);
            var expect = (JObject)step["expect"] ?? new JObject();
            Assert.AreEqual((string)step["npc"], update.NpcId);
            if (expect["request_id"] != null)
                Assert.AreEqual((string)expect["request_id"], update.RequestId);
            if ((bool?)expect["bark"] == true)
            {
                var words = (update.Bark ?? "").Split((char[])null, StringSplitOptions.RemoveEmptyEntries).Length;
                Assert.That(words >= 1 && words <= 8, "bark " + update.Bark);
            }
            if (expect["target_in"] != null)
                CollectionAssert.Contains(expect["target_in"].Select(t => (string)t).ToList(), update.Target, "target");
        }

        private Task AckAsync(JObject step, string who)
        {
            var status = (Status)Enum.Parse(typeof(Status), (string)step["status"], true);
            if (step["call"] != null)
            {
                var calls = _turns[(string)step["turn"]].Events.OfType<ToolCall>().ToList();
                var call = calls[(int)step["call"]];
                return Client(who).AckAsync(call.TurnId, call.CallId, status);
            }
            return Client(who).AckAsync((string)step["turn"], (string)step["call_id"], status);
        }

        private async Task SendAsync(JObject step, string who)
        {
            var message = (JObject)Fill(step["message"], who);
            if ((bool?)step["refused_locally"] == true)
            {
                try
                {
                    await Client(who).SendAsync(message);
                }
                catch (ValidationException)
                {
                    return;
                }
                Assert.Fail("the SDK sent a message that breaks the schema: " + message);
            }
            await Client(who).SendAsync(message);
        }

        /// <summary>The frame <c>count</c> times (default 1), each send as soon as the socket took
        /// the one before.</summary>
        private async Task SendRawAsync(JObject step, string who)
        {
            byte[] frame;
            var text = step["text"] != null;
            if (text)
            {
                var one = (string)Fill(step["text"], who);
                frame = Encoding.UTF8.GetBytes(string.Concat(Enumerable.Repeat(one, (int?)step["repeat"] ?? 1)));
            }
            else if (step["binary_base64"] != null)
            {
                frame = Convert.FromBase64String((string)step["binary_base64"]);
            }
            else
            {
                var audio = step["audio_frame"];
                frame = Protocol.EncodeAudioFrame((JObject)Fill(audio["header"], who), Convert.FromBase64String((string)audio["pcm_base64"]));
            }
            ClientWebSocket ws;
            var bare = _bare.TryGetValue(who, out ws);
            var count = (int?)step["count"] ?? 1;
            for (var i = 0; i < count; i++)
            {
                if (bare)
                    await ws.SendAsync(new ArraySegment<byte>(frame), text ? WebSocketMessageType.Text : WebSocketMessageType.Binary, true, CancellationToken.None);
                else if (text)
                    await Client(who).SendRawAsync(Encoding.UTF8.GetString(frame));
                else
                    await Client(who).SendRawAsync(frame);
            }
        }

        /// <summary>Reads (and skips) what the server sends on a bare connection until it closes
        /// it, then checks the close code: the close frame is read after what came before it.</summary>
        private async Task ExpectClosedAsync(JObject step, string who)
        {
            ClientWebSocket ws;
            Assert.IsTrue(_bare.TryGetValue(who, out ws), "expect_closed is for a bare connection; " + who + " is not one");
            var buffer = new byte[64 * 1024];
            try
            {
                WebSocketReceiveResult received;
                do
                    received = await ws.ReceiveAsync(new ArraySegment<byte>(buffer), CancellationToken.None);
                while (received.MessageType != WebSocketMessageType.Close);
            }
            catch (WebSocketException e)
            {
                Assert.Fail("the connection ended without a close frame (" + ws.State + "): " + e.Message);
            }
            Assert.AreEqual((int)step["expect"]["code"], (int?)ws.CloseStatus, "close code" + (string.IsNullOrEmpty(ws.CloseStatusDescription) ? "" : " (" + ws.CloseStatusDescription + ")"));
        }

        private async Task ExpectErrorAsync(JObject step, string who)
        {
            Error error = null;
            while (error == null)
            {
                ClientWebSocket ws;
                object e = _bare.TryGetValue(who, out ws) ? await BareNextAsync(ws) : await Client(who).NextEventAsync(ConformanceTests.WaitS);
                error = e as Error;
                SpokenLog spoken;
                if (error != null && TrySpoken(error.TurnId, out spoken))
                    error = null; // a spoken turn's: the client reads that turn
            }
            foreach (var wanted in ((JObject)step["expect"]).Properties())
            {
                var got = Protocol.ToJson(error)[wanted.Name];
                Assert.AreEqual((string)wanted.Value, got == null ? null : (string)got, wanted.Name + " of " + Protocol.ToJson(error));
            }
        }

        private static async Task<IServerMessage> BareNextAsync(ClientWebSocket ws)
        {
            var buffer = new byte[64 * 1024];
            var frame = new MemoryStream();
            WebSocketReceiveResult received;
            do
            {
                received = await ws.ReceiveAsync(new ArraySegment<byte>(buffer), CancellationToken.None);
                frame.Write(buffer, 0, received.Count);
            }
            while (!received.EndOfMessage);
            return Protocol.ParseServerFrame(Encoding.UTF8.GetString(frame.ToArray()));
        }

        private async Task ReadAsync(JObject step)
        {
            var log = _turns[(string)step["turn"]];
            var until = (string)step["until"];
            await log.ReadAsync(until);
            if (until == "end")
                CheckTurn(log, (JObject)step["expect"] ?? new JObject());
        }

        private void CheckTurn(TurnLog log, JObject expect)
        {
            var seen = string.Join(" | ", log.Events.Select(e => Protocol.ToJson(e).ToString(Newtonsoft.Json.Formatting.None)));
            if (seen.Length > 2000)
                seen = seen.Substring(0, 2000);
            var deltas = log.Events.OfType<LlmStreamDelta>().ToList();
            CollectionAssert.AreEqual(Enumerable.Range(0, deltas.Count).Select(i => (long)i), deltas.Select(d => d.Seq), "seq has gaps: " + seen);
            Assert.AreEqual((bool?)expect["lost"] ?? false, log.Lost, "lost: " + seen);
            if (expect["finish_reason"] != null)
            {
                var reason = log.Turn.FinishReason == null ? null : Wire(log.Turn.FinishReason.Value);
                CollectionAssert.Contains(expect["finish_reason"].Select(r => (string)r).ToList(), reason, "finish_reason: " + seen);
            }
            if ((bool?)expect["text"] == true)
                Assert.IsNotEmpty(log.Turn.Text.Trim(), "text: " + seen);
            var calls = log.Events.OfType<ToolCall>().ToList();
            if (expect["tool_calls"] != null)
            {
                var wanted = (JArray)expect["tool_calls"];
                CollectionAssert.AreEqual(wanted.Select(c => (string)c["name"]), calls.Select(c => c.Name), "tool_calls: " + seen);
                for (var i = 0; i < calls.Count; i++)
                {
                    foreach (var arg in ((JObject)wanted[i]["args"] ?? new JObject()).Properties())
                    {
                        Assert.IsTrue(calls[i].Args.ContainsKey(arg.Name), "args: " + seen);
                        Assert.IsTrue(JToken.DeepEquals(arg.Value, JToken.FromObject(calls[i].Args[arg.Name])), "args: " + seen);
                    }
                }
            }
            if (expect["distinct_calls"] != null)
                Assert.AreEqual((int)expect["distinct_calls"], calls.Select(c => c.CallId).Distinct().Count(), "distinct_calls: " + seen);
            if (expect["tool_runs"] != null)
            {
                int runs;
                lock (_toolRuns)
                    _toolRuns.TryGetValue(log.Turn.TurnId, out runs);
                Assert.AreEqual((int)expect["tool_runs"], runs, "tool_runs: " + seen);
            }
            if ((bool?)expect["voiced"] == true)
            {
                var end = deltas.FindIndex(d => d.FinishReason == FinishReason.ToolCall);
                Assert.That(end >= 0 && string.Concat(deltas.Skip(end + 1).Select(d => d.Delta)).Trim().Length > 0, "voiced: " + seen);
            }
            if (expect["cutoffs"] != null)
                CollectionAssert.AreEqual(expect["cutoffs"].Select(c => (string)c), log.Events.OfType<Cutoff>().Select(c => c.Reason == null ? null : Wire(c.Reason.Value)), "cutoffs: " + seen);
            if (expect["errors"] != null)
                CollectionAssert.AreEqual(expect["errors"].Select(c => (string)c), log.Events.OfType<Error>().Select(e => e.Code), "errors: " + seen);
        }

        /// <summary>An enum's name on the wire (<c>FinishReason.ToolCall</c>: <c>tool_call</c>).</summary>
        private static string Wire(Enum value)
        {
            return Protocol.WireName(value);
        }
    }
}
