using System;
using System.Linq;
using System.Text;
using Newtonsoft.Json.Linq;
using NUnit.Framework;

namespace Mythic.Client.Tests
{
    /// <summary>Frames to messages and back, and the schema check of what the client sends.</summary>
    [TestFixture]
    public class ProtocolTests
    {
        [Test]
        public void Every_message_type_the_server_sends_is_read_into_its_generated_class()
        {
            CollectionAssert.IsNotEmpty(Protocol.ServerMessageTypes);
            foreach (var type in Protocol.ServerMessageTypes)
            {
                // Fields missing: the schema check names them; an unknown type would be unknown_type.
                var e = Assert.Throws<ProtocolException>(() => Protocol.ParseServerFrame("{\"schema_version\": \"v1\", \"type\": \"" + type + "\"}"));
                Assert.AreEqual("invalid_message", e.Code, type);
                StringAssert.StartsWith(type + ".", e.Ref);
            }
            var welcome = (Welcome)Protocol.ParseServerFrame("{\"schema_version\": \"v1\", \"type\": \"Welcome\", \"session_id\": \"s-1\", \"resume_token\": \"r\", \"max_frame_bytes\": 5}");
            Assert.AreEqual("s-1", welcome.SessionId);
        }

        [TestCase("{\"type\": \"PlayerUtterance\", \"npc_id\": \"marla\", \"session_id\": \"s-1\", \"turn_id\": \"t-1\", \"text\": \"\"}", "PlayerUtterance.text")]
        [TestCase("{\"type\": \"SceneUpdate\", \"npc_id\": \"marla\", \"time\": \"25:00\"}", "SceneUpdate.time")]
        [TestCase("{\"type\": \"SceneUpdate\", \"npc_id\": \"marla\", \"objects\": [{\"id\": \"x\", \"dist\": -1}]}", "SceneUpdate.objects.0.dist")]
        [TestCase("{\"type\": \"IntentRequest\", \"npc_id\": \"not an id!\", \"request_id\": \"i-1\"}", "IntentRequest.npc_id")]
        [TestCase("{\"type\": \"IntentRequest\", \"npc_id\": \"marla\\n\", \"request_id\": \"i-1\"}", "IntentRequest.npc_id")]
        [TestCase("{\"type\": \"Cutoff\", \"npc_id\": \"marla\", \"session_id\": \"s-1\", \"turn_id\": \"t-1\", \"mood\": \"cross\"}", "Cutoff.mood")]
        [TestCase("{\"type\": \"Ack\", \"ack_of\": \"ToolCall\", \"status\": \"maybe\"}", "Ack.status")]
        [TestCase("{\"type\": \"SessionStart\", \"voice\": {\"input_rate\": 22050}}", "SessionStart.voice.input_rate")]
        [TestCase("{\"type\": \"Welcome\", \"session_id\": \"s\", \"resume_token\": \"r\", \"max_frame_bytes\": 5}", "type")]
        [TestCase("{\"type\": \"Teleport\"}", "type")]
        [TestCase("{\"schema_version\": \"v2\", \"type\": \"SessionEnd\", \"session_id\": \"s-1\"}", "SessionEnd.schema_version")]
        public void What_breaks_the_client_schema_is_refused_with_the_field(string message, string field)
        {
            var e = Assert.Throws<ValidationException>(() => Protocol.CheckOutgoing(JObject.Parse(message)));
            Assert.AreEqual(field, e.Ref, e.Message);
        }

        [TestCase("{\"type\": \"Ack\", \"ack_of\": \"ToolCall\", \"status\": \"ok\", \"turn_id\": \"t-1\"}", "Ack.call_id", "is required when ack_of is \"ToolCall\"")]
        [TestCase("{\"type\": \"SessionStart\", \"session_id\": \"s-1\"}", "SessionStart.resume_token", "is required when session_id is given")]
        [TestCase("{\"type\": \"SessionStart\", \"resume_token\": \"r-1\"}", "SessionStart.session_id", "is required when resume_token is given")]
        public void What_breaks_a_cross_field_rule_is_refused_with_the_field_and_the_rule(string message, string field, string why)
        {
            var e = Assert.Throws<ValidationException>(() => Protocol.CheckOutgoing(JObject.Parse(message)));
            Assert.AreEqual(field, e.Ref, e.Message);
            Assert.AreEqual(field + ": " + why, e.Message);
        }

        [TestCase("{\"type\": \"Ack\", \"ack_of\": \"ToolCall\", \"status\": \"ok\", \"turn_id\": \"t-1\", \"call_id\": \"c-1\"}")]
        [TestCase("{\"type\": \"Ack\", \"ack_of\": \"SceneUpdate\", \"status\": \"ok\"}")]
        [TestCase("{\"type\": \"SessionStart\"}")]
        [TestCase("{\"type\": \"SessionStart\", \"session_id\": \"s-1\", \"resume_token\": \"r-1\"}")]
        [TestCase("{\"type\": \"SessionStart\", \"voice\": {\"input_rate\": 16000}}")]
        [TestCase("{\"type\": \"SessionStart\", \"voice\": {\"input_rate\": 32000}}")]
        [TestCase("{\"type\": \"SessionStart\", \"voice\": {\"input_rate\": 48000, \"binary\": true}}")]
        public void What_keeps_the_cross_field_rules_is_sent(string message)
        {
            Assert.AreEqual((string)JObject.Parse(message)["type"], (string)Protocol.CheckOutgoing(JObject.Parse(message))["type"]);
        }

        [Test]
        public void The_generated_classes_are_held_to_the_same_rules()
        {
            var ack = new Ack { AckOf = AckOf.ToolCall, Status = Status.Ok, TurnId = "t-1" };
            Assert.AreEqual("Ack.call_id", Assert.Throws<ValidationException>(() => Protocol.CheckOutgoing(ack)).Ref);
            ack.CallId = "c-1";
            Assert.AreEqual("c-1", (string)Protocol.CheckOutgoing(ack)["call_id"]);
            var start = new SessionStart { SessionId = "s-1", Voice = new VoiceFormat { InputRate = 44100 } };
            Assert.AreEqual("SessionStart.voice.input_rate", Assert.Throws<ValidationException>(() => Protocol.CheckOutgoing(start)).Ref);
            start.Voice.InputRate = 48000;
            Assert.AreEqual("SessionStart.resume_token", Assert.Throws<ValidationException>(() => Protocol.CheckOutgoing(start)).Ref);
            start.ResumeToken = "r-1";
            Assert.AreEqual(48000, (long)Protocol.CheckOutgoing(start)["voice"]["input_rate"]);
        }

        [TestCase("\"final\": true", "LLMStreamDelta.finish_reason: is required when final is true")]
        [TestCase("\"final\": true, \"finish_reason\": null", "LLMStreamDelta.finish_reason: must be a string when final is true")]
        [TestCase("\"final\": false, \"finish_reason\": \"stop\"", "LLMStreamDelta.finish_reason: must be null unless final is true")]
        [TestCase("\"finish_reason\": \"stop\"", "LLMStreamDelta.finish_reason: must be null unless final is true")]
        public void A_delta_that_breaks_the_final_rule_is_refused_from_the_server(string fields, string why)
        {
            var e = Assert.Throws<ProtocolException>(() => Protocol.ParseServerFrame(Delta(fields)));
            Assert.AreEqual("invalid_message", e.Code);
            Assert.AreEqual("LLMStreamDelta.finish_reason", e.Ref);
            StringAssert.EndsWith(why, e.Message);
        }

        [TestCase("\"final\": true, \"finish_reason\": \"stop\"", true)]
        [TestCase("\"final\": false, \"finish_reason\": null", false)]
        [TestCase("\"final\": false", false)]
        [TestCase("", false)]
        public void A_delta_that_keeps_the_final_rule_is_read(string fields, bool final)
        {
            var delta = (LlmStreamDelta)Protocol.ParseServerFrame(Delta(fields));
            Assert.AreEqual(final, delta.FinishReason != null);
            Assert.AreEqual(final ? FinishReason.Stop : (FinishReason?)null, delta.FinishReason);
        }

        private static string Delta(string fields)
        {
            return "{\"schema_version\": \"v1\", \"type\": \"LLMStreamDelta\", \"npc_id\": \"marla\", \"session_id\": \"s-1\", \"turn_id\": \"t-1\", \"seq\": 0, \"delta\": \"Evening.\"" + (fields.Length > 0 ? ", " + fields : "") + "}";
        }

        [Test]
        public void A_valid_message_gets_its_schema_version_and_loses_its_nulls()
        {
            var checkedMessage = Protocol.CheckOutgoing(new IntentRequest { NpcId = "grisk", RequestId = "i-1", WithBark = true });
            Assert.AreEqual("v1", (string)checkedMessage["schema_version"]);
            Assert.AreEqual("IntentRequest", (string)checkedMessage["type"]);
            Assert.IsNull(checkedMessage["context"]);
            Assert.AreEqual("tool_call", Protocol.WireName(FinishReason.ToolCall));
        }

        [Test]
        public void Audio_frames_round_trip_and_bad_ones_are_named()
        {
            var header = new JObject
            {
                { "schema_version", "v1" }, { "type", "TTSChunk" }, { "npc_id", "marla" }, { "session_id", "s-1" },
                { "turn_id", "t-1" }, { "seq", 3 }, { "sample_rate", 16000 },
            };
            var pcm = new byte[] { 0, 1, 2, 3 };
            var chunk = Protocol.DecodeAudioFrame(Protocol.EncodeAudioFrame(header, pcm));
            Assert.AreEqual(3, chunk.Seq);
            CollectionAssert.AreEqual(pcm, chunk.PcmBytes);
            Assert.AreEqual(Convert.ToBase64String(pcm), chunk.Pcm);
            Assert.AreEqual("bad_audio_frame", Assert.Throws<ProtocolException>(() => Protocol.DecodeAudioFrame(Encoding.ASCII.GetBytes("RIFF0000"))).Code);
            var tooLong = Protocol.EncodeAudioFrame(header, pcm);
            tooLong[4] = 0xff;
            Assert.AreEqual("bad_audio_frame", Assert.Throws<ProtocolException>(() => Protocol.DecodeAudioFrame(tooLong)).Code);
            header["pcm"] = "AAAA";
            Assert.AreEqual("bad_audio_frame", Assert.Throws<ProtocolException>(() => Protocol.DecodeAudioFrame(Protocol.EncodeAudioFrame(header, pcm))).Code);
        }
    }
}
