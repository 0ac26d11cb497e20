using System;
using System.Collections.Generic;
using System.IO;
using System.Linq;
using System.Net.WebSockets;
using System.Text;
using System.Threading;
using System.Threading.Tasks;
using Newtonsoft.Json.Linq;

namespace Mythic.Client
{
    /// <summary>What a tool handler returns: the Ack's status, and the result for the NPC to react
    /// to.</summary>
    public sealed class ToolResult
    {
        public ToolResult(Status status, Dictionary<string, object> result = null, string message = null)
        {
            Status = status;
            Result = result;
            Message = message;
        }

        /// <summary><c>Ok</c>, <c>Error</c> or <c>Rejected</c>.</summary>
        public Status Status { get; }

        public Dictionary<string, object> Result { get; }

        /// <summary>Why it failed or was rejected (the first 1000 characters are sent).</summary>
        public string Message { get; }

        public static ToolResult Ok(Dictionary<string, object> result = null)
        {
            return new ToolResult(Status.Ok, result);
        }

        public static ToolResult Rejected(string message = null)
        {
            return new ToolResult(Status.Rejected, null, message);
        }
    }

    /// <summary>How a <see cref="MythicClient"/> connects, waits and reconnects.</summary>
    public sealed class MythicClientOptions
    {
        /// <summary>The player the session belongs to.</summary>
        public string PlayerId { get; set; }

        /// <summary>Answers every ToolCall with an Ack (once per <c>call_id</c>); without it, call
        /// <see cref="MythicClient.AckAsync"/>.</summary>
        public Func<ToolCall, Task<ToolResult>> ToolHandler { get; set; }

        /// <summary>Where the tool handler runs: Unity's main-thread context (what
        /// <c>MythicConnection</c> passes) lets it touch game objects; null runs it on the thread
        /// pool.</summary>
        public SynchronizationContext HandlerContext { get; set; }

        /// <summary>Reconnect and resume the session when the connection drops (default true).</summary>
        public bool Reconnect { get; set; } = true;

        /// <summary>First wait before reconnecting, doubled after each failed try up to
        /// <see cref="MaxBackoff"/>.</summary>
        public TimeSpan Backoff { get; set; } = TimeSpan.FromMilliseconds(100);

        public TimeSpan MaxBackoff { get; set; } = TimeSpan.FromSeconds(5);

        /// <summary>Tries before the client gives up reconnecting (and reports a
        /// ConnectionLostException).</summary>
        public int MaxReconnects { get; set; } = 10;

        /// <summary>The bound on every wait: connecting, an answer, the next event of a turn.</summary>
        public TimeSpan Timeout { get; set; } = TimeSpan.FromSeconds(30);

        /// <summary>The session talks by voice: the format of its audio.</summary>
        public VoiceFormat Voice { get; set; }

        /// <summary>Events of no turn kept for <see cref="MythicClient.NextEventAsync"/>; the
        /// oldest are dropped beyond it.</summary>
        public int MaxEvents { get; set; } = 1024;

        /// <summary>The largest frame read from the server; a larger one is skipped and reported.</summary>
        public int MaxFrameBytes { get; set; } = 4 << 20;
    }

    /// <summary>A game's connection to a Mythic server.
    /// <code>
    /// var client = new MythicClient("ws://127.0.0.1:8765/v1/ws", new MythicClientOptions { ToolHandler = Act });
    /// await client.ConnectAsync();
    /// var turn = await client.SayAsync("marla", "Is the tavern open?");
    /// await foreach (var piece in turn.TextStream()) Debug.Log(piece);
    /// await client.CloseAsync();
    /// </code>
    /// The client reconnects by itself with bounded backoff and resumes its session (the NPCs keep
    /// their history); turns in flight when the connection drops end with
    /// <see cref="ConnectionLostException"/>. Messages of no turn, and frames it could not read, go
    /// to <see cref="NextEventAsync"/> and <see cref="Event"/>. Every wait is bounded by
    /// <see cref="Timeout"/>; nothing the server sends throws into the caller except through the
    /// task that waits for it.</summary>
    public sealed class MythicClient : IDisposable
    {
        private const int RememberedCalls = 256;
        private static readonly TimeSpan CloseGrace = TimeSpan.FromSeconds(1);

        private readonly MythicClientOptions _options;
        private readonly object _gate = new object();
        private readonly Dictionary<string, Turn> _turns = new Dictionary<string, Turn>();
        private readonly Dictionary<string, Scene> _scenes = new Dictionary<string, Scene>();
        private readonly Dictionary<string, SceneTalk> _sceneTalks = new Dictionary<string, SceneTalk>();
        private readonly List<SceneCall> _sceneCalls = new List<SceneCall>();
        private readonly Dictionary<string, TaskCompletionSource<IntentUpdate>> _intents = new Dictionary<string, TaskCompletionSource<IntentUpdate>>();
        private readonly Dictionary<string, Task<ToolResult>> _calls = new Dictionary<string, Task<ToolResult>>();
        private readonly Queue<string> _callOrder = new Queue<string>();
        private readonly HashSet<Task> _background = new HashSet<Task>();
        private readonly Inbox<object> _events;
        private readonly SemaphoreSlim _sending = new SemaphoreSlim(1, 1);
        private Connection _current;
        private TaskCompletionSource<bool> _connected;
        private CancellationTokenSource _running = new CancellationTokenSource();
        private string _resumeToken;
        private bool _stopped = true;
        private int _count;

        public MythicClient(string url, MythicClientOptions options = null)
        {
            Url = new Uri(url);
            _options = options ?? new MythicClientOptions();
            _events = new Inbox<object>(_options.MaxEvents);
        }

        public Uri Url { get; }

        public TimeSpan Timeout => _options.Timeout;

        /// <summary>The session's id, once connected.</summary>
        public string SessionId { get; private set; } = "";

        /// <summary>How many times the session was resumed (after a drop, or Disconnect then Connect).</summary>
        public int Resumes { get; private set; }

        /// <summary>Whether a connection is open and welcomed now.</summary>
        public bool IsConnected
        {
            get
            {
                lock (_gate)
                    return _current != null;
            }
        }

        /// <summary>The socket of the current connection (for diagnostics and tests); null while
        /// disconnected.</summary>
        public ClientWebSocket Socket
        {
            get
            {
                lock (_gate)
                    return _current == null ? null : _current.Socket;
            }
        }

        /// <summary>Each message of no turn, and each frame the client could not read
        /// (<see cref="ProtocolException"/>) or connection it gave up on, as it arrives. Raised on
        /// the socket's thread.</summary>
        public event Action<object> Event;

        /// <summary>Each TTSChunk (an NPC's voice with its visemes) as it arrives, on the socket's
        /// thread: hand it to a <see cref="SpeechPlayback"/>.</summary>
        public event Action<TtsChunk> Speech;

        /// <summary>Each Cutoff the server sends (an NPC stopped talking: stop its audio), on the
        /// socket's thread.</summary>
        public event Action<Cutoff> CutoffReceived;

        // -- lifecycle ----------------------------------------------------------------------------

        /// <summary>Connects and opens the session, or resumes it after <see cref="DisconnectAsync"/>.</summary>
        /// <exception cref="ServerException">The server refused the session.</exception>
        /// <exception cref="ConnectionLostException">No connection to the server.</exception>
        /// <exception cref="WaitTimeoutException">No Welcome within <see cref="Timeout"/>.</exception>
        /// <exception cref="MythicException">Connected already.</exception>
        public Task<Welcome> ConnectAsync()
        {
            lock (_gate)
            {
                if (_current != null)
                    throw new MythicException("already connected (session " + SessionId + ")");
                if (_stopped)
                {
                    _stopped = false;
                    _running = new CancellationTokenSource();
                }
                if (_connected == null)
                    _connected = new TaskCompletionSource<bool>(TaskCreationOptions.RunContinuationsAsynchronously);
            }
            return OpenAsync();
        }

        /// <summary>Closes the connection without ending the session: <see cref="ConnectAsync"/>
        /// resumes it.</summary>
        public Task DisconnectAsync()
        {
            Stop();
            return CloseSocketAsync();
        }

        /// <summary>Ends the session (SessionEnd) and closes the connection.</summary>
        public async Task CloseAsync()
        {
            Connection connection;
            lock (_gate)
                connection = _current;
            if (connection != null && SessionId.Length > 0)
            {
                try
                {
                    var end = new JObject { { "schema_version", Protocol.Version }, { "type", "SessionEnd" }, { "session_id", SessionId } };
                    await SendOnAsync(connection, Encoding.UTF8.GetBytes(end.ToString(Newtonsoft.Json.Formatting.None)), WebSocketMessageType.Text).ConfigureAwait(false);
                }
                catch (ConnectionLostException)
                {
                    // Gone already: nothing to end.
                }
            }
            Stop();
            await CloseSocketAsync().ConfigureAwait(false);
            Task[] pending;
            lock (_background)
                pending = _background.ToArray();
            await Bounded(Task.WhenAll(pending), Timeout, "tool handlers to finish").ConfigureAwait(false);
        }

        /// <summary>Aborts the connection at once, as <see cref="CloseAsync"/> would without its
        /// waits (for <c>OnDestroy</c>).</summary>
        public void Dispose()
        {
            Stop();
            var socket = Socket;
            if (socket != null)
                socket.Abort();
        }

        private void Stop()
        {
            lock (_gate)
            {
                _stopped = true;
                _running.Cancel();
            }
        }

        private async Task CloseSocketAsync()
        {
            Connection connection;
            lock (_gate)
                connection = _current;
            if (connection == null)
                return;
            try
            {
                using (var timeout = new CancellationTokenSource(Timeout))
                    await connection.Socket.CloseOutputAsync(WebSocketCloseStatus.NormalClosure, "", timeout.Token).ConfigureAwait(false);
                // The server's close frame ends the reader; Mono's ClientWebSocket may never
                // hand it over, so the wait for it is short and the socket is aborted after it.
                await Bounded(connection.Reader, CloseGrace < Timeout ? CloseGrace : Timeout, "close of the connection").ConfigureAwait(false);
            }
            catch (Exception e) when (IsSocketFailure(e) || e is WaitTimeoutException)
            {
                connection.Socket.Abort();
            }
            finally
            {
                connection.Socket.Dispose();
            }
        }

        private async Task<Welcome> OpenAsync()
        {
            var socket = new ClientWebSocket();
            try
            {
                using (var timeout = new CancellationTokenSource(Timeout))
                    await socket.ConnectAsync(Url, timeout.Token).ConfigureAwait(false);
            }
            catch (Exception e) when (IsSocketFailure(e))
            {
                socket.Dispose();
                throw new ConnectionLostException("cannot connect to " + Url + ": " + e.Message, e);
            }
            var start = new SessionStart { PlayerId = _options.PlayerId, Voice = _options.Voice };
            lock (_gate)
            {
                if (_resumeToken != null)
                {
                    start.SessionId = SessionId;
                    start.ResumeToken = _resumeToken;
                }
            }
            var connection = new Connection(socket);
            try
            {
                var frame = Protocol.CheckOutgoing(start).ToString(Newtonsoft.Json.Formatting.None);
                await SendOnAsync(connection, Encoding.UTF8.GetBytes(frame), WebSocketMessageType.Text).ConfigureAwait(false);
                connection.Reader = Task.Run(() => ReadAsync(connection));
                return await Bounded(connection.Welcomed.Task, Timeout, "Welcome from " + Url).ConfigureAwait(false);
            }
            catch (MythicException)
            {
                bool current;
                lock (_gate)
                    current = _current == connection;
                if (!current)
                    socket.Abort();
                throw;
            }
        }

        /// <summary>The connection's reader: frames in, until it closes (a task of its own per
        /// connection; <see cref="CloseSocketAsync"/> awaits it).</summary>
        private async Task ReadAsync(Connection connection)
        {
            var buffer = new byte[16 * 1024];
            var frame = new MemoryStream();
            try
            {
                while (true)
                {
                    var received = await connection.Socket.ReceiveAsync(new ArraySegment<byte>(buffer), CancellationToken.None).ConfigureAwait(false);
                    if (received.MessageType == WebSocketMessageType.Close)
                        break;
                    if (frame.Length + received.Count <= _options.MaxFrameBytes)
                        frame.Write(buffer, 0, received.Count);
                    else
                        frame.SetLength(_options.MaxFrameBytes + 1L);
                    if (!received.EndOfMessage)
                        continue;
                    var bytes = frame.ToArray();
                    frame.SetLength(0);
                    if (bytes.Length > _options.MaxFrameBytes)
                    {
                        Report(new ProtocolException("frame_too_large", "the server sent a frame larger than " + _options.MaxFrameBytes + " bytes"));
                        continue;
                    }
                    var message = Read(bytes, received.MessageType);
                    if (message != null)
                        Receive(connection, message);
                }
            }
            catch (Exception e) when (IsSocketFailure(e))
            {
                // The connection is gone: the same as a close, below.
            }
            catch (Exception e)
            {
                // The top of the reader: whatever went wrong is reported, never thrown into the game.
                Report(new MythicException("the connection's reader failed: " + e, false, e));
            }
            finally
            {
                connection.Welcomed.TrySetException(new ConnectionLostException("the connection to " + Url + " closed before Welcome"));
                Lost(connection);
            }
        }

        private IServerMessage Read(byte[] bytes, WebSocketMessageType kind)
        {
            try
            {
                if (kind == WebSocketMessageType.Binary)
                    return Protocol.DecodeAudioFrame(bytes);
                string text;
                try
                {
                    text = new UTF8Encoding(false, true).GetString(bytes);
                }
                catch (ArgumentException)
                {
                    throw new ProtocolException("bad_json", "the server sent a text frame that is not UTF-8");
                }
                return Protocol.ParseServerFrame(text);
            }
            catch (ProtocolException e)
            {
                Report(e);
                return null;
            }
        }

        private void Receive(Connection connection, IServerMessage message)
        {
            if (!connection.IsWelcomed)
            {
                var welcome = message as Welcome;
                if (welcome != null)
                {
                    lock (_gate)
                    {
                        connection.IsWelcomed = true;
                        _current = connection;
                        SessionId = welcome.SessionId;
                        _resumeToken = welcome.ResumeToken;
                        if (welcome.Resumed == true)
                            Resumes += 1;
                        _connected.TrySetResult(true);
                    }
                    connection.Welcomed.TrySetResult(welcome);
                    return;
                }
                var error = message as Error;
                if (error != null)
                {
                    connection.Welcomed.TrySetException(new ServerException(error));
                    connection.Socket.Abort();
                    return;
                }
            }
            Route(message);
        }

        /// <summary>A connection is gone: fail the turns and intents in flight, then resume unless
        /// stopped.</summary>
        private void Lost(Connection connection)
        {
            List<Turn> turns;
            List<TaskCompletionSource<IntentUpdate>> intents;
            List<SceneTalk> talks;
            List<SceneCall> calls;
            bool resume;
            lock (_gate)
            {
                if (_current != connection)
                    return;
                _current = null;
                _connected = new TaskCompletionSource<bool>(TaskCreationOptions.RunContinuationsAsynchronously);
                turns = _turns.Values.ToList();
                _turns.Clear();
                intents = _intents.Values.ToList();
                _intents.Clear();
                talks = _sceneTalks.Values.Distinct().ToList();
                _sceneTalks.Clear();
                calls = _sceneCalls.ToList();
                resume = !_stopped && _options.Reconnect;
            }
            foreach (var turn in turns)
                turn.Inbox.Fail(new ConnectionLostException("connection lost during turn " + turn.TurnId));
            foreach (var intent in intents)
                intent.TrySetException(new ConnectionLostException("connection lost"));
            foreach (var talk in talks)
                talk.Finish(new ConnectionLostException("connection lost during scene line " + talk.TurnId));
            foreach (var call in calls)
                call.Answer.TrySetException(new ConnectionLostException("connection lost"));
            if (resume)
                Track(ResumeAsync());
        }

        private async Task ResumeAsync()
        {
            var backoff = _options.Backoff;
            CancellationToken running;
            lock (_gate)
                running = _running.Token;
            for (var attempt = 0; attempt < _options.MaxReconnects && !running.IsCancellationRequested; attempt++)
            {
                try
                {
                    await Task.Delay(backoff, running).ConfigureAwait(false);
                    await OpenAsync().ConfigureAwait(false);
                    return;
                }
                catch (OperationCanceledException)
                {
                    return;
                }
                catch (ServerException e) when (e.Code == "unknown_session")
                {
                    lock (_gate)
                        _resumeToken = null; // the session expired: open a fresh one
                }
                catch (MythicException)
                {
                    backoff = TimeSpan.FromTicks(Math.Min(_options.MaxBackoff.Ticks, backoff.Ticks * 2));
                }
            }
            if (!running.IsCancellationRequested)
            {
                Stop();
                Report(new ConnectionLostException("gave up reconnecting to " + Url + " after " + _options.MaxReconnects + " tries"));
            }
        }

        // -- sending ------------------------------------------------------------------------------

        /// <summary>Sends a message (a generated message class, or a JObject) after checking it
        /// against the v1 schema, waiting (bounded) while the client reconnects.</summary>
        /// <exception cref="ValidationException">The message breaks the schema; nothing was sent.</exception>
        /// <exception cref="WaitTimeoutException">Not connected within <see cref="Timeout"/>.</exception>
        /// <exception cref="ConnectionLostException">The connection dropped while sending.</exception>
        public Task SendAsync(object message)
        {
            var checkedMessage = Protocol.CheckOutgoing(message);
            return SendFrameAsync(Encoding.UTF8.GetBytes(checkedMessage.ToString(Newtonsoft.Json.Formatting.None)), WebSocketMessageType.Text);
        }

        /// <summary>Sends a text frame as it is, past the schema check: for conformance tests and
        /// debugging a server, never for game messages.</summary>
        public Task SendRawAsync(string frame)
        {
            return SendFrameAsync(Encoding.UTF8.GetBytes(frame), WebSocketMessageType.Text);
        }

        /// <summary>Sends a binary frame as it is, past the schema check.</summary>
        public Task SendRawAsync(byte[] frame)
        {
            return SendFrameAsync(frame, WebSocketMessageType.Binary);
        }

        private async Task SendFrameAsync(byte[] frame, WebSocketMessageType kind)
        {
            Task<bool> connected;
            lock (_gate)
            {
                if (_connected == null)
                    throw new MythicException("ConnectAsync() first");
                connected = _connected.Task;
            }
            await Bounded(connected, Timeout, "connection to send on").ConfigureAwait(false);
            Connection connection;
            lock (_gate)
                connection = _current;
            if (connection == null)
                throw new ConnectionLostException("the connection dropped before the message was sent");
            await SendOnAsync(connection, frame, kind).ConfigureAwait(false);
        }

        private async Task SendOnAsync(Connection connection, byte[] frame, WebSocketMessageType kind)
        {
            if (!await _sending.WaitAsync(Timeout).ConfigureAwait(false))
                throw new WaitTimeoutException("no turn to send within " + Timeout.TotalSeconds + " s");
            try
            {
                using (var timeout = new CancellationTokenSource(Timeout))
                    await connection.Socket.SendAsync(new ArraySegment<byte>(frame), kind, true, timeout.Token).ConfigureAwait(false);
            }
            catch (Exception e) when (IsSocketFailure(e))
            {
                throw new ConnectionLostException("the message was not sent: " + e.Message, e);
            }
            finally
            {
                _sending.Release();
            }
        }

        /// <summary>Says <paramref name="text"/> to an NPC; read the returned turn for the reply.</summary>
        public async Task<Turn> SayAsync(string npcId, string text, string turnId = null)
        {
            turnId = turnId ?? NewId("t");
            var turn = new Turn(this, npcId, turnId);
            lock (_gate)
                _turns[turnId] = turn;
            try
            {
                await SendAsync(new PlayerUtterance { NpcId = npcId, SessionId = SessionId, TurnId = turnId, Text = text, PlayerId = _options.PlayerId }).ConfigureAwait(false);
            }
            catch (MythicException)
            {
                Forget(turnId);
                throw;
            }
            return turn;
        }

        /// <summary>Tells an NPC what it perceives now (<paramref name="objects"/>: id to distance in
        /// metres) and the game's <paramref name="date"/> (year-month-day in the world's calendar)
        /// and <paramref name="time"/> (HH:MM); what is left null stays as it was.</summary>
        public Task SceneAsync(string npcId, string zone = null, string time = null, IDictionary<string, double> objects = null, string date = null)
        {
            return SendAsync(new SceneUpdate
            {
                NpcId = npcId,
                Zone = zone,
                Time = time,
                Date = date,
                Objects = objects == null ? null : objects.Select(o => new SceneObject { Id = o.Key, Dist = o.Value }).ToList(),
            });
        }

        /// <summary>Asks for an NPC's intent (the game's intent cache) and waits for it.</summary>
        /// <exception cref="WaitTimeoutException">No answer within <see cref="Timeout"/>.</exception>
        /// <exception cref="ConnectionLostException">The connection dropped first.</exception>
        public async Task<IntentUpdate> IntentAsync(string npcId, string context = null, bool withBark = false, string requestId = null)
        {
            requestId = requestId ?? NewId("i");
            var answer = new TaskCompletionSource<IntentUpdate>(TaskCreationOptions.RunContinuationsAsynchronously);
            lock (_gate)
            {
                if (_intents.ContainsKey(requestId))
                    throw new MythicException("intent request " + requestId + " is already waiting");
                _intents[requestId] = answer;
            }
            try
            {
                await SendAsync(new IntentRequest { NpcId = npcId, RequestId = requestId, Context = context, WithBark = withBark }).ConfigureAwait(false);
                return await Bounded(answer.Task, Timeout, "IntentUpdate for " + requestId).ConfigureAwait(false);
            }
            finally
            {
                lock (_gate)
                    _intents.Remove(requestId);
            }
        }

        // -- scenes -------------------------------------------------------------------------------

        /// <summary>Opens a scene of <paramref name="npcs"/> with this client's player in it; the
        /// player's lines to it (<see cref="Scene.SayAsync"/>) are answered by the NPC they name,
        /// else the one the player faces, else the scene's choice.</summary>
        /// <exception cref="ServerException">The server refused it (an unknown NPC, a duplicate, too many).</exception>
        /// <exception cref="WaitTimeoutException">No answer within <see cref="Timeout"/>.</exception>
        public async Task<Scene> StartSceneAsync(string sceneId, IEnumerable<string> npcs, long? maxExchanges = null)
        {
            var scene = new Scene(this, sceneId);
            await SceneCallAsync(scene, "SceneStart", new SceneStart { SceneId = sceneId, SessionId = SessionId, Npcs = npcs.ToList(), MaxExchanges = maxExchanges }).ConfigureAwait(false);
            return scene;
        }

        /// <summary>This client's player joins a scene another player opened (it hears what follows).</summary>
        /// <exception cref="ServerException">No such scene, or it has ended.</exception>
        public async Task<Scene> JoinSceneAsync(string sceneId)
        {
            var scene = new Scene(this, sceneId);
            await SceneCallAsync(scene, "SceneJoin", new SceneJoin { SceneId = sceneId, SessionId = SessionId }).ConfigureAwait(false);
            return scene;
        }

        /// <summary>Sends a scene message; done when the scene's state (or end) answers it.</summary>
        internal async Task SceneCallAsync(Scene scene, string kind, object message)
        {
            var call = new SceneCall(kind, scene);
            bool opening;
            lock (_gate)
            {
                opening = !_scenes.ContainsKey(scene.SceneId);
                if (opening)
                    _scenes[scene.SceneId] = scene;
                _sceneCalls.Add(call);
            }
            try
            {
                await SendAsync(message).ConfigureAwait(false);
                await Bounded(call.Answer.Task, Timeout, "answer to " + kind).ConfigureAwait(false);
            }
            catch (MythicException)
            {
                lock (_gate)
                {
                    Scene known;
                    if (opening && scene.Npcs.Count == 0 && _scenes.TryGetValue(scene.SceneId, out known) && known == scene)
                        _scenes.Remove(scene.SceneId);
                }
                throw;
            }
            finally
            {
                lock (_gate)
                    _sceneCalls.Remove(call);
            }
        }

        internal void Listen(string turnId, SceneTalk talk)
        {
            lock (_gate)
                _sceneTalks[turnId] = talk;
        }

        internal void Unlisten(IEnumerable<string> turnIds, SceneTalk talk)
        {
            lock (_gate)
            {
                foreach (var turnId in turnIds)
                {
                    SceneTalk known;
                    if (_sceneTalks.TryGetValue(turnId, out known) && known == talk)
                        _sceneTalks.Remove(turnId);
                }
            }
        }

        /// <summary>Hands a scene or a scene line its messages; true when one took it.</summary>
        private bool RouteScene(IServerMessage message)
        {
            var state = message as SceneState;
            var end = message as SceneEnd;
            if (state != null || end != null)
            {
                var sceneId = state != null ? state.SceneId : end.SceneId;
                Scene scene;
                List<SceneCall> answered;
                lock (_gate)
                {
                    if (!_scenes.TryGetValue(sceneId, out scene))
                        return false;
                    if (end != null)
                        _scenes.Remove(sceneId);
                    answered = _sceneCalls.Where(c => c.Scene == scene).ToList();
                }
                if (state != null)
                    scene.OnState(state);
                else
                    scene.OnEnd(end.Reason ?? "ended");
                foreach (var call in answered)
                    call.Answer.TrySetResult(true);
                return true;
            }
            var sceneTurn = message as SceneTurn;
            var turnEvent = message as ITurnEvent;
            var turnId = sceneTurn != null ? sceneTurn.TurnId : turnEvent != null ? TurnOf(turnEvent) : null;
            SceneTalk talk = null;
            lock (_gate)
            {
                if (turnId != null)
                    _sceneTalks.TryGetValue(turnId, out talk);
            }
            if (talk != null)
            {
                if (sceneTurn != null)
                    talk.OnTurn(sceneTurn);
                else if (message is LlmStreamDelta)
                    talk.OnDelta((LlmStreamDelta)message);
                else
                    talk.OnEvent(turnEvent);
                return true;
            }
            var error = message as Error;
            if (error != null && error.Ref != null)
            {
                var kind = error.Ref.Split('.')[0];
                SceneCall call;
                lock (_gate)
                    call = _sceneCalls.FirstOrDefault(c => c.Kind == kind && !c.Answer.Task.IsCompleted);
                if (call != null)
                {
                    call.Answer.TrySetException(new ServerException(error));
                    return true;
                }
            }
            return false;
        }

        private sealed class SceneCall
        {
            internal SceneCall(string kind, Scene scene)
            {
                Kind = kind;
                Scene = scene;
            }

            internal string Kind { get; }

            internal Scene Scene { get; }

            internal TaskCompletionSource<bool> Answer { get; } = new TaskCompletionSource<bool>(TaskCreationOptions.RunContinuationsAsynchronously);
        }

        /// <summary>Answers a tool call (what the tool handler does for you).</summary>
        public Task AckAsync(string turnId, string callId, Status status, Dictionary<string, object> result = null, string message = null)
        {
            if (message != null && message.Length > 1000)
                message = message.Substring(0, 1000);
            return SendAsync(new Ack { AckOf = AckOf.ToolCall, Status = status, TurnId = turnId, CallId = callId, Result = result, Message = message });
        }

        /// <summary>Sends a chunk of the player's microphone audio (16-bit little-endian mono PCM)
        /// as a binary audio frame.</summary>
        /// <exception cref="ValidationException">Not whole 16-bit samples, or a header that breaks
        /// the schema.</exception>
        public Task SendAudioAsync(string npcId, byte[] pcm, long? sampleRate = null, string turnId = null, bool end = false)
        {
            var voice = _options.Voice;
            if (voice == null)
                throw new MythicException("this client's session has no voice: set MythicClientOptions.Voice");
            if (pcm.Length < 2 || pcm.Length % 2 != 0)
                throw new ValidationException("pcm is 16-bit samples: an even number of bytes, at least 2", "AudioChunk.pcm");
            var header = Protocol.CheckOutgoing(new AudioChunk
            {
                NpcId = npcId,
                SessionId = SessionId,
                SampleRate = sampleRate ?? voice.InputRate ?? 16000,
                TsClient = (DateTime.UtcNow - new DateTime(1970, 1, 1, 0, 0, 0, DateTimeKind.Utc)).TotalSeconds,
                TurnId = turnId,
                End = end,
                Pcm = "AAAA", // checked with a stand-in: the frame carries the PCM raw, after the header
            });
            header.Remove("pcm");
            return SendFrameAsync(Protocol.EncodeAudioFrame(header, pcm), WebSocketMessageType.Binary);
        }

        // -- receiving ----------------------------------------------------------------------------

        /// <summary>The next message of no turn (NPC states, pushed intents, errors, speech), or a
        /// <see cref="MythicException"/> for a frame the client could not read.</summary>
        /// <exception cref="WaitTimeoutException">Nothing within the bound (default <see cref="Timeout"/>).</exception>
        public Task<object> NextEventAsync(TimeSpan? timeout = null, CancellationToken cancel = default(CancellationToken))
        {
            return _events.TakeAsync(timeout ?? Timeout, "event", cancel);
        }

        /// <summary>A turn that ended stops receiving.</summary>
        internal void Forget(string turnId)
        {
            lock (_gate)
                _turns.Remove(turnId);
        }

        private void Route(IServerMessage message)
        {
            var call = message as ToolCall;
            if (call != null && _options.ToolHandler != null)
                Track(AnswerAsync(call, _options.ToolHandler));
            var chunk = message as TtsChunk;
            if (chunk != null)
                Raise(Speech, chunk);
            var cutoff = message as Cutoff;
            if (cutoff != null)
                Raise(CutoffReceived, cutoff);
            if (RouteScene(message))
                return;
            var turnEvent = message as ITurnEvent;
            if (turnEvent != null)
            {
                var turnId = TurnOf(turnEvent);
                Turn turn = null;
                lock (_gate)
                {
                    if (turnId != null)
                        _turns.TryGetValue(turnId, out turn);
                }
                if (turn != null)
                {
                    turn.Inbox.Put(turnEvent);
                    return;
                }
            }
            var update = message as IntentUpdate;
            if (update != null && update.RequestId != null)
            {
                TaskCompletionSource<IntentUpdate> answer;
                lock (_gate)
                    _intents.TryGetValue(update.RequestId, out answer);
                if (answer != null)
                {
                    answer.TrySetResult(update);
                    return;
                }
            }
            Report(message);
        }

        private static string TurnOf(ITurnEvent e)
        {
            if (e is LlmStreamDelta)
                return ((LlmStreamDelta)e).TurnId;
            if (e is ToolCall)
                return ((ToolCall)e).TurnId;
            if (e is Cutoff)
                return ((Cutoff)e).TurnId;
            return ((Error)e).TurnId;
        }

        private void Report(object e)
        {
            _events.Put(e);
            Raise(Event, e);
        }

        private void Raise<T>(Action<T> handlers, T e)
        {
            if (handlers == null)
                return;
            try
            {
                handlers(e);
            }
            catch (Exception error)
            {
                // The game's handler failed: its error is the game's, not the connection's.
                _events.Put(new MythicException("an event handler of the game threw: " + error, false, error));
            }
        }

        /// <summary>Runs the tool handler once per <c>call_id</c>: a call the server sends again
        /// (its Ack was late or lost) is acknowledged <c>duplicate</c> with the first answer, and
        /// not run again.</summary>
        private async Task AnswerAsync(ToolCall call, Func<ToolCall, Task<ToolResult>> handler)
        {
            Task<ToolResult> running;
            bool first;
            lock (_calls)
            {
                first = !_calls.TryGetValue(call.CallId, out running);
                if (first)
                {
                    running = RunHandlerAsync(call, handler);
                    _calls[call.CallId] = running;
                    _callOrder.Enqueue(call.CallId);
                    if (_callOrder.Count > RememberedCalls)
                        _calls.Remove(_callOrder.Dequeue());
                }
            }
            var result = await running.ConfigureAwait(false);
            try
            {
                await AckAsync(call.TurnId, call.CallId, first ? result.Status : Status.Duplicate, result.Result, result.Message).ConfigureAwait(false);
            }
            catch (MythicException e)
            {
                Report(new ConnectionLostException("the Ack of " + call.CallId + " was not sent: " + e.Message, e));
            }
        }

        private async Task<ToolResult> RunHandlerAsync(ToolCall call, Func<ToolCall, Task<ToolResult>> handler)
        {
            try
            {
                var context = _options.HandlerContext;
                Task<ToolResult> running;
                if (context == null)
                {
                    running = Task.Run(() => handler(call));
                }
                else
                {
                    var started = new TaskCompletionSource<Task<ToolResult>>(TaskCreationOptions.RunContinuationsAsynchronously);
                    context.Post(_ =>
                    {
                        try
                        {
                            started.SetResult(handler(call));
                        }
                        catch (Exception e)
                        {
                            started.SetException(e);
                        }
                    }, null);
                    running = started.Task.Unwrap();
                }
                return await Bounded(running, Timeout, "tool handler of " + call.Name).ConfigureAwait(false) ?? ToolResult.Rejected("the handler returned nothing");
            }
            catch (Exception e)
            {
                // The game's handler failed: the NPC hears that the tool failed, and why.
                return new ToolResult(Status.Error, null, e.Message);
            }
        }

        private void Track(Task task)
        {
            lock (_background)
                _background.Add(task);
            task.ContinueWith(done =>
            {
                lock (_background)
                    _background.Remove(done);
            }, TaskContinuationOptions.ExecuteSynchronously);
        }

        internal string NewId(string prefix)
        {
            return prefix + "-" + DateTime.UtcNow.Ticks.ToString("x") + "-" + Interlocked.Increment(ref _count);
        }

        private static bool IsSocketFailure(Exception e)
        {
            return e is WebSocketException || e is IOException || e is ObjectDisposedException || e is OperationCanceledException || e is InvalidOperationException;
        }

        /// <summary><paramref name="task"/>'s result, or a WaitTimeoutException after <paramref name="timeout"/>.</summary>
        public static async Task<T> Bounded<T>(Task<T> task, TimeSpan timeout, string what)
        {
            await Bounded((Task)task, timeout, what).ConfigureAwait(false);
            return await task.ConfigureAwait(false);
        }

        public static async Task Bounded(Task task, TimeSpan timeout, string what)
        {
            using (var cancel = new CancellationTokenSource())
            {
                if (await Task.WhenAny(task, Task.Delay(timeout, cancel.Token)).ConfigureAwait(false) != task)
                    throw new WaitTimeoutException("no " + what + " within " + timeout.TotalSeconds + " s");
                cancel.Cancel();
            }
            await task.ConfigureAwait(false);
        }

        /// <summary>One WebSocket connection: its reader, and whether the server welcomed it.</summary>
        private sealed class Connection
        {
            internal Connection(ClientWebSocket socket)
            {
                Socket = socket;
            }

            internal ClientWebSocket Socket { get; }

            internal Task Reader { get; set; }

            internal bool IsWelcomed { get; set; }

            internal TaskCompletionSource<Welcome> Welcomed { get; } = new TaskCompletionSource<Welcome>(TaskCreationOptions.RunContinuationsAsynchronously);
        }
    }
}
