using System;
using System.IO;
using System.Linq;
using System.Net;
using System.Net.Sockets;
using System.Security.Cryptography;
using System.Text;
using System.Threading.Tasks;
using Newtonsoft.Json.Linq;

namespace Mythic.Client.Tests
{
    /// <summary>A WebSocket server on loopback that the test scripts frame by frame: the server's
    /// side of the boundary, for the client's unit tests (a real socket, a real handshake).</summary>
    internal sealed class ScriptedPeer : IDisposable
    {
        internal static readonly TimeSpan Wait = TimeSpan.FromSeconds(10);
        private readonly TcpListener _listener = new TcpListener(IPAddress.Loopback, 0);

        internal ScriptedPeer()
        {
            _listener.Start();
            Url = "ws://127.0.0.1:" + ((IPEndPoint)_listener.LocalEndpoint).Port + "/v1/ws";
        }

        internal string Url { get; }

        /// <summary>The next client connection, after its handshake.</summary>
        internal async Task<PeerConnection> AcceptAsync()
        {
            var tcp = await MythicClient.Bounded(_listener.AcceptTcpClientAsync(), Wait, "client connection").ConfigureAwait(false);
            var peer = new PeerConnection(tcp);
            await MythicClient.Bounded(peer.HandshakeAsync(), Wait, "handshake").ConfigureAwait(false);
            return peer;
        }

        /// <summary>Accepts a connection, reads its SessionStart and welcomes it.</summary>
        internal async Task<PeerConnection> WelcomeAsync(string sessionId = "s-1", bool resumed = false)
        {
            var peer = await AcceptAsync().ConfigureAwait(false);
            var start = await peer.ReceiveAsync().ConfigureAwait(false);
            if ((string)start["type"] != "SessionStart")
                throw new InvalidDataException("expected SessionStart, got " + start);
            peer.Start = start;
            await peer.SendAsync(new JObject
            {
                { "schema_version", "v1" }, { "type", "Welcome" }, { "session_id", sessionId },
                { "resume_token", "r-" + sessionId }, { "max_frame_bytes", 262144 }, { "resumed", resumed },
            }).ConfigureAwait(false);
            return peer;
        }

        public void Dispose()
        {
            _listener.Stop();
        }
    }

    internal sealed class PeerConnection : IDisposable
    {
        private readonly TcpClient _tcp;
        private readonly NetworkStream _stream;

        internal PeerConnection(TcpClient tcp)
        {
            _tcp = tcp;
            _stream = tcp.GetStream();
        }

        /// <summary>The SessionStart the client sent (after <see cref="ScriptedPeer.WelcomeAsync"/>).</summary>
        internal JObject Start { get; set; }

        internal async Task HandshakeAsync()
        {
            var request = new StringBuilder();
            var one = new byte[1];
            while (!request.ToString().EndsWith("\r\n\r\n", StringComparison.Ordinal))
            {
                if (await _stream.ReadAsync(one, 0, 1).ConfigureAwait(false) == 0)
                    throw new EndOfStreamException("the client left during the handshake");
                request.Append((char)one[0]);
            }
            var key = request.ToString().Split(new[] { "\r\n" }, StringSplitOptions.None)
                .First(l => l.StartsWith("Sec-WebSocket-Key:", StringComparison.OrdinalIgnoreCase)).Substring(18).Trim();
            string accept;
            using (var sha1 = SHA1.Create())
                accept = Convert.ToBase64String(sha1.ComputeHash(Encoding.ASCII.GetBytes(key + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11")));
            var response = "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: " + accept + "\r\n\r\n";
            var bytes = Encoding.ASCII.GetBytes(response);
            await _stream.WriteAsync(bytes, 0, bytes.Length).ConfigureAwait(false);
        }

        /// <summary>The next JSON message the client sent (binary frames are skipped).</summary>
        internal async Task<JObject> ReceiveAsync()
        {
            while (true)
            {
                var frame = await ReceiveFrameAsync().ConfigureAwait(false);
                if (frame.Item1 == 1)
                    return JObject.Parse(Encoding.UTF8.GetString(frame.Item2));
            }
        }

        /// <summary>The next frame: opcode (1 text, 2 binary, 8 close) and payload, within the wait.</summary>
        internal Task<Tuple<int, byte[]>> ReceiveFrameAsync()
        {
            return MythicClient.Bounded(ReadFrameAsync(), ScriptedPeer.Wait, "frame from the client");
        }

        private async Task<Tuple<int, byte[]>> ReadFrameAsync()
        {
            var head = await ReadExactlyAsync(2).ConfigureAwait(false);
            var opcode = head[0] & 0x0f;
            long length = head[1] & 0x7f;
            if (length == 126)
            {
                var b = await ReadExactlyAsync(2).ConfigureAwait(false);
                length = b[0] << 8 | b[1];
            }
            else if (length == 127)
            {
                var b = await ReadExactlyAsync(8).ConfigureAwait(false);
                length = b.Aggregate(0L, (n, x) => n << 8 | x);
            }
            var mask = (head[1] & 0x80) != 0 ? await ReadExactlyAsync(4).ConfigureAwait(false) : new byte[4];
            var payload = await ReadExactlyAsync((int)length).ConfigureAwait(false);
            for (var i = 0; i < payload.Length; i++)
                payload[i] ^= mask[i % 4];
            if (opcode == 8)
                await WriteFrameAsync(8, payload.Take(2).ToArray()).ConfigureAwait(false);
            return Tuple.Create(opcode, payload);
        }

        private async Task<byte[]> ReadExactlyAsync(int count)
        {
            var buffer = new byte[count];
            var at = 0;
            while (at < count)
            {
                var n = await _stream.ReadAsync(buffer, at, count - at).ConfigureAwait(false);
                if (n == 0)
                    throw new EndOfStreamException("the client closed the connection");
                at += n;
            }
            return buffer;
        }

        internal Task SendAsync(JObject message)
        {
            return SendTextAsync(message.ToString(Newtonsoft.Json.Formatting.None));
        }

        internal Task SendTextAsync(string text)
        {
            return WriteFrameAsync(1, Encoding.UTF8.GetBytes(text));
        }

        internal Task SendBinaryAsync(byte[] data)
        {
            return WriteFrameAsync(2, data);
        }

        private async Task WriteFrameAsync(int opcode, byte[] payload)
        {
            var frame = new MemoryStream();
            frame.WriteByte((byte)(0x80 | opcode));
            if (payload.Length < 126)
            {
                frame.WriteByte((byte)payload.Length);
            }
            else if (payload.Length <= 0xffff)
            {
                frame.WriteByte(126);
                frame.WriteByte((byte)(payload.Length >> 8));
                frame.WriteByte((byte)payload.Length);
            }
            else
            {
                frame.WriteByte(127);
                for (var shift = 56; shift >= 0; shift -= 8)
                    frame.WriteByte((byte)((long)payload.Length >> shift));
            }
            frame.Write(payload, 0, payload.Length);
            var bytes = frame.ToArray();
            await _stream.WriteAsync(bytes, 0, bytes.Length).ConfigureAwait(false);
        }

        /// <summary>The network drops: the TCP connection is reset, no close handshake.</summary>
        internal void Drop()
        {
            _tcp.Client.LingerState = new LingerOption(true, 0);
            _tcp.Close();
        }

        public void Dispose()
        {
            _tcp.Close();
        }
    }
}
