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
        [TestCase("{\"type\": \"Welcome\", \"session_id\": \"s\", \"resume_token\": \"r\", \"max_frame_bytes\": 5}", "type")]
        [TestCase("{\"type\": \"Teleport\"}", "type")]
        [TestCase("{\"schema_version\": \"v2\", \"type\": \"SessionEnd\", \"session_id\": \"s-1\"}", "SessionEnd.schema_version")]
        public void What_breaks_the_client_schema_is_refused_with_the_field(string message, string field)
        {
            var e = Assert.Throws<ValidationException>(() => Protocol.CheckOutgoing(JObject.Parse(message)));
            Assert.AreEqual(field, e.Ref, e.Message);
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
