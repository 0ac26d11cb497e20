using System;
using System.Collections.Generic;
using System.IO;
using System.Linq;
using System.Text;
using Newtonsoft.Json;
using Newtonsoft.Json.Linq;

namespace Mythic.Client
{
    /// <summary>Messages to frames and back: the schema check of what a client sends, JSON frames
    /// and binary audio frames. Nothing here throws anything but this package's typed
    /// exceptions.</summary>
    public static class Protocol
    {
        /// <summary>The protocol version this client speaks.</summary>
        public const string Version = "v1";

        /// <summary>The first four bytes of a binary audio frame: <c>MYA1</c>.</summary>
        public static readonly byte[] AudioFrameMagic = { 0x4d, 0x59, 0x41, 0x31 };

        private static readonly SchemaCheck ClientSchema = new SchemaCheck(Schemas.Client);
        private static readonly SchemaCheck ServerSchema = new SchemaCheck(Schemas.Server);
        private static readonly JsonSerializer Serializer = JsonSerializer.Create(new JsonSerializerSettings
        {
            ContractResolver = new WithoutChecks(),
            MetadataPropertyHandling = Converter.Settings.MetadataPropertyHandling,
            DateParseHandling = DateParseHandling.None,
            Converters = Converter.Settings.Converters,
        });

        // What each message type the server sends is read into (the generated classes).
        private static readonly Dictionary<string, Type> ServerTypes = new Dictionary<string, Type>
        {
            { "Welcome", typeof(Welcome) },
            { "SessionEnd", typeof(SessionEnd) },
            { "ASRPartial", typeof(AsrPartial) },
            { "ASRFinal", typeof(AsrFinal) },
            { "LLMStreamDelta", typeof(LlmStreamDelta) },
            { "TTSChunk", typeof(TtsChunk) },
            { "ToolCall", typeof(ToolCall) },
            { "IntentUpdate", typeof(IntentUpdate) },
            { "NPCState", typeof(NpcState) },
            { "SceneState", typeof(SceneState) },
            { "SceneTurn", typeof(SceneTurn) },
            { "SceneEnd", typeof(SceneEnd) },
            { "Cutoff", typeof(Cutoff) },
            { "Ack", typeof(Ack) },
            { "Error", typeof(Error) },
        };

        /// <summary>The message types a client sends, and the server sends (from the schemas).</summary>
        public static ISet<string> ClientTypes => ClientSchema.Types;

        public static ISet<string> ServerMessageTypes => ServerSchema.Types;

        /// <summary>A message as JSON: a generated message class, or a JObject as it is. Fields
        /// that are null are left out (as the server writes them).</summary>
        public static JObject ToJson(object message)
        {
            if (message == null)
                throw new ValidationException("no message", "type");
            var obj = message as JObject ?? JObject.FromObject(message, Serializer);
            var copy = (JObject)obj.DeepClone();
            WithoutNulls(copy);
            return copy;
        }

        /// <summary>An enum's name on the wire: <c>FinishReason.ToolCall</c> is <c>tool_call</c>.</summary>
        public static string WireName(Enum value)
        {
            return (string)JToken.FromObject(value, Serializer);
        }

        /// <summary>The message ready to send: <c>schema_version</c> filled in, and the whole
        /// checked against the client schema.</summary>
        /// <exception cref="ValidationException">It breaks the schema (it is not sent).</exception>
        public static JObject CheckOutgoing(object message)
        {
            var obj = ToJson(message);
            if (obj["schema_version"] == null)
                obj.AddFirst(new JProperty("schema_version", Version));
            var typeToken = obj["type"];
            var type = typeToken != null && typeToken.Type == JTokenType.String ? (string)typeToken : null;
            if (type == null || !ClientSchema.Types.Contains(type))
            {
                var why = type != null && ServerSchema.Types.Contains(type) ? "is not sent by a client" : "is not a v1 message type";
                throw new ValidationException((type ?? "(no type)") + " " + why, "type");
            }
            var wrong = ClientSchema.Violation(type, obj);
            if (wrong != null)
                throw new ValidationException(wrong.Item2, wrong.Item1);
            return obj;
        }

        /// <summary>Reads one JSON frame from the server.</summary>
        /// <exception cref="ProtocolException">Not JSON, not an object, another
        /// <c>schema_version</c>, an unknown or client-only type, or fields outside the schema.</exception>
        public static IServerMessage ParseServerFrame(string text)
        {
            return ParseServerObject(JsonObject(text, "a frame"));
        }

        private static JObject JsonObject(string text, string what)
        {
            JToken token;
            try
            {
                using (var reader = new JsonTextReader(new StringReader(text)) { DateParseHandling = DateParseHandling.None })
                {
                    token = JToken.ReadFrom(reader);
                    if (reader.Read())
                        throw new JsonReaderException("more after the JSON value");
                }
            }
            catch (JsonException e)
            {
                throw new ProtocolException("bad_json", "the server sent " + what + " that is not JSON: " + e.Message);
            }
            var obj = token as JObject;
            if (obj == null)
                throw new ProtocolException("not_an_object", "the server sent " + what + " that is not a JSON object");
            return obj;
        }

        private static IServerMessage ParseServerObject(JObject obj)
        {
            var version = obj["schema_version"];
            if (version == null || version.Type != JTokenType.String || (string)version != Version)
            {
                throw new ProtocolException(
                    "bad_schema_version",
                    "the server speaks schema_version " + (version == null ? "(none)" : version.ToString(Formatting.None)) + ", this client "
                        + Version + ": use a client release of the server's protocol version",
                    "schema_version");
            }
            var typeToken = obj["type"];
            var type = typeToken != null && typeToken.Type == JTokenType.String ? (string)typeToken : null;
            Type target;
            if (type == null || !ServerSchema.Types.Contains(type) || !ServerTypes.TryGetValue(type, out target))
            {
                throw new ProtocolException(
                    "unknown_type",
                    "the server sent a message of type " + (typeToken == null ? "(none)" : typeToken.ToString(Formatting.None))
                        + ", which a v1 server never sends",
                    "type");
            }
            var wrong = ServerSchema.Violation(type, obj);
            if (wrong != null)
                throw new ProtocolException("invalid_message", "the server sent " + wrong.Item2, wrong.Item1);
            WithoutNulls(obj);
            try
            {
                return (IServerMessage)obj.ToObject(target, Serializer);
            }
            catch (Exception e) when (e is JsonException || e is FormatException || e is InvalidCastException)
            {
                throw new ProtocolException("invalid_message", "the server sent a " + type + " this client cannot read: " + e.Message);
            }
        }

        /// <summary>A binary audio frame: <c>MYA1</c>, the header's length (4 bytes,
        /// little-endian), the message as JSON without <c>pcm</c> (the header), then the raw 16-bit
        /// little-endian PCM. Audio travels without base64's third more bytes.</summary>
        public static byte[] EncodeAudioFrame(JObject header, byte[] pcm)
        {
            var json = Encoding.UTF8.GetBytes(header.ToString(Formatting.None));
            var frame = new byte[8 + json.Length + pcm.Length];
            Buffer.BlockCopy(AudioFrameMagic, 0, frame, 0, 4);
            var size = json.Length;
            frame[4] = (byte)size;
            frame[5] = (byte)(size >> 8);
            frame[6] = (byte)(size >> 16);
            frame[7] = (byte)(size >> 24);
            Buffer.BlockCopy(json, 0, frame, 8, json.Length);
            Buffer.BlockCopy(pcm, 0, frame, 8 + json.Length, pcm.Length);
            return frame;
        }

        /// <summary>A <c>TTSChunk</c> from a binary frame of the server.</summary>
        /// <exception cref="ProtocolException">Not <c>MYA1</c>, a bad header length, or a header
        /// that is not a valid TTSChunk without <c>pcm</c>.</exception>
        public static TtsChunk DecodeAudioFrame(byte[] frame)
        {
            if (frame.Length < 8 || !AudioFrameMagic.SequenceEqual(frame.Take(4)))
                throw new ProtocolException("bad_audio_frame", "a binary frame from the server must start with MYA1");
            var size = (long)(uint)(frame[4] | frame[5] << 8 | frame[6] << 16 | frame[7] << 24);
            if (size > frame.Length - 8)
                throw new ProtocolException("bad_audio_frame", "the audio header claims " + size + " bytes; the frame has " + (frame.Length - 8));
            string text;
            try
            {
                text = new UTF8Encoding(false, true).GetString(frame, 8, (int)size);
            }
            catch (ArgumentException)
            {
                throw new ProtocolException("bad_audio_frame", "the audio header is not UTF-8");
            }
            var header = JsonObject(text, "an audio header");
            if ((string)header["type"] != "TTSChunk" || header["pcm"] != null)
                throw new ProtocolException("bad_audio_frame", "a binary frame from the server is a TTSChunk header without pcm");
            var pcm = new byte[frame.Length - 8 - size];
            Buffer.BlockCopy(frame, 8 + (int)size, pcm, 0, pcm.Length);
            header["pcm"] = Convert.ToBase64String(pcm);
            var chunk = (TtsChunk)ParseServerObject(header);
            chunk.PcmBytes = pcm;
            return chunk;
        }

        /// <summary>The generated classes' own checks (quicktype's *CheckConverter attributes) left
        /// out: they throw a bare Exception without the field, and the schema check before any
        /// conversion says the same with the field's ref.</summary>
        private sealed class WithoutChecks : Newtonsoft.Json.Serialization.DefaultContractResolver
        {
            protected override Newtonsoft.Json.Serialization.JsonProperty CreateProperty(System.Reflection.MemberInfo member, MemberSerialization serialization)
            {
                var property = base.CreateProperty(member, serialization);
                if (property.Converter != null && property.Converter.GetType().Name.EndsWith("CheckConverter", StringComparison.Ordinal))
                    property.Converter = null;
                return property;
            }
        }

        // Top-level fields only: a null inside a tool's args or result is the tool's own value.
        private static void WithoutNulls(JObject obj)
        {
            foreach (var property in obj.Properties().Where(p => p.Value.Type == JTokenType.Null).ToList())
                property.Remove();
        }
    }
}
