using System;
using Newtonsoft.Json;

namespace Mythic.Client
{
    /// <summary>A message the server sends (the generated classes of Generated/Messages.cs).</summary>
    public interface IServerMessage { }

    /// <summary>What a <see cref="Turn"/> yields: <see cref="LlmStreamDelta"/>,
    /// <see cref="ToolCall"/>, <see cref="Cutoff"/> or <see cref="Error"/>.</summary>
    public interface ITurnEvent : IServerMessage { }

    public partial class Welcome : IServerMessage { }

    public partial class SessionEnd : IServerMessage { }

    public partial class AsrPartial : IServerMessage { }

    public partial class AsrFinal : IServerMessage { }

    public partial class LlmStreamDelta : ITurnEvent { }

    public partial class ToolCall : ITurnEvent { }

    public partial class Cutoff : ITurnEvent { }

    public partial class Error : ITurnEvent { }

    public partial class IntentUpdate : IServerMessage { }

    public partial class NpcState : IServerMessage { }

    public partial class SceneState : IServerMessage { }

    public partial class SceneTurn : IServerMessage { }

    public partial class SceneEnd : IServerMessage { }

    public partial class Ack : IServerMessage { }

    public partial class TtsChunk : IServerMessage
    {
        private byte[] _pcmBytes;

        /// <summary>The chunk's audio as raw 16-bit little-endian mono PCM at
        /// <see cref="SampleRate"/> (<see cref="Pcm"/> is the same, in base64).</summary>
        [JsonIgnore]
        public byte[] PcmBytes
        {
            get { return _pcmBytes ?? (_pcmBytes = Pcm == null ? new byte[0] : Convert.FromBase64String(Pcm)); }
            internal set { _pcmBytes = value; }
        }
    }
}
