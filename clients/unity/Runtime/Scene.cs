using System;
using System.Collections.Generic;
using System.Linq;
using System.Text;
using System.Threading;
using System.Threading.Tasks;

namespace Mythic.Client
{
    /// <summary>One NPC's reply in a scene: to the player's line, or to another NPC's.</summary>
    public sealed class SceneReply
    {
        private readonly List<LlmStreamDelta> _deltas = new List<LlmStreamDelta>();

        internal SceneReply(string npcId, string turnId)
        {
            NpcId = npcId;
            TurnId = turnId;
        }

        public string NpcId { get; }

        /// <summary>The reply's turn: the line's own for its first reply, <c>line.1</c>, ... after.</summary>
        public string TurnId { get; }

        public IReadOnlyList<LlmStreamDelta> Deltas => _deltas;

        /// <summary>Set by its final delta; null while it streams.</summary>
        public FinishReason? FinishReason { get; internal set; }

        public string Text
        {
            get
            {
                var text = new StringBuilder();
                foreach (var d in _deltas)
                    text.Append(d.Delta ?? "");
                return text.ToString();
            }
        }

        internal void Add(LlmStreamDelta delta)
        {
            _deltas.Add(delta);
        }
    }

    /// <summary>A line said to a scene (the player's, or the game's cue for NPCs talking among
    /// themselves) and every reply it gets, in order, as the scene announces them
    /// (<see cref="SceneTurn"/>). It is over when the scene says nobody answers the last reply,
    /// when the line is refused (<see cref="Errors"/>), when a new line to the scene stopped it
    /// (its reply then ends <c>Cutoff</c>), or when the scene ends. <see cref="NextAsync"/> gives
    /// its events (SceneTurn, LlmStreamDelta, ToolCall, Error); <see cref="WaitAsync"/> all of it.</summary>
    public sealed class SceneTalk
    {
        private static readonly object End = new object();
        private readonly object _lock = new object();
        private readonly List<SceneReply> _replies = new List<SceneReply>();
        private readonly List<SceneTurn> _turns = new List<SceneTurn>();
        private readonly List<Error> _errors = new List<Error>();
        private readonly Dictionary<string, SceneReply> _open = new Dictionary<string, SceneReply>();
        private readonly Inbox<object> _inbox = new Inbox<object>();
        private bool _stopped;
        private bool _ended;

        internal SceneTalk(Scene scene, string turnId)
        {
            Scene = scene;
            TurnId = turnId;
        }

        public Scene Scene { get; }

        public string TurnId { get; }

        public IReadOnlyList<SceneReply> Replies
        {
            get { lock (_lock) return _replies.ToList(); }
        }

        public IReadOnlyList<SceneTurn> Turns
        {
            get { lock (_lock) return _turns.ToList(); }
        }

        public IReadOnlyList<Error> Errors
        {
            get { lock (_lock) return _errors.ToList(); }
        }

        /// <summary>Who answered, in order.</summary>
        public IReadOnlyList<string> Speakers => Replies.Select(r => r.NpcId).ToList();

        /// <summary>Whether every reply is in (or the line was refused, stopped, or the scene ended).</summary>
        public bool Over { get; private set; }

        /// <summary>The next event; null once it is over.</summary>
        /// <exception cref="ConnectionLostException">The connection dropped first.</exception>
        /// <exception cref="WaitTimeoutException">Nothing for the line within the client's timeout.</exception>
        public async Task<object> NextAsync(CancellationToken cancel = default(CancellationToken))
        {
            if (Over)
                return null;
            object e;
            try
            {
                e = await _inbox.TakeAsync(Scene.Client.Timeout, "message for scene line " + TurnId, cancel).ConfigureAwait(false);
            }
            catch (MythicException)
            {
                Over = true;
                throw;
            }
            if (e == End)
            {
                Over = true;
                return null;
            }
            return e;
        }

        /// <summary>Waits until it is over; itself.</summary>
        public async Task<SceneTalk> WaitAsync(CancellationToken cancel = default(CancellationToken))
        {
            while (await NextAsync(cancel).ConfigureAwait(false) != null) { }
            return this;
        }

        internal void OnTurn(SceneTurn turn)
        {
            bool closes;
            lock (_lock)
            {
                _turns.Add(turn);
                for (var i = 0; i < turn.Speakers.Count; i++)
                {
                    var reply = new SceneReply(turn.Speakers[i], turn.TurnIds[i]);
                    _replies.Add(reply);
                    _open[reply.TurnId] = reply;
                    Scene.Client.Listen(reply.TurnId, this);
                }
                closes = turn.Speakers.Count == 0;
            }
            _inbox.Put(turn);
            if (closes)
                Finish(null);
        }

        internal void OnDelta(LlmStreamDelta delta)
        {
            bool done = false;
            lock (_lock)
            {
                SceneReply reply;
                if (!_open.TryGetValue(delta.TurnId, out reply))
                    return;
                reply.Add(delta);
                if (delta.Final == true && delta.FinishReason != Client.FinishReason.ToolCall)
                {
                    reply.FinishReason = delta.FinishReason;
                    _open.Remove(delta.TurnId);
                    done = _stopped && _open.Count == 0;
                }
            }
            _inbox.Put(delta);
            if (done)
                Finish(null);
        }

        internal void OnEvent(ITurnEvent e)
        {
            var refused = false;
            lock (_lock)
            {
                var error = e as Error;
                if (error != null)
                {
                    _errors.Add(error);
                    refused = error.TurnId == TurnId && _replies.Count == 0;
                }
            }
            _inbox.Put(e);
            if (refused)
                Finish(null);
        }

        /// <summary>A new line to the scene stopped this one: over once its reply in flight ends.</summary>
        internal void Stop()
        {
            bool done;
            lock (_lock)
            {
                _stopped = true;
                done = _open.Count == 0;
            }
            if (done)
                Finish(null);
        }

        internal void Finish(Exception error)
        {
            List<string> turnIds;
            lock (_lock)
            {
                if (_ended)
                    return;
                _ended = true;
                turnIds = _replies.Select(r => r.TurnId).ToList();
            }
            turnIds.Add(TurnId);
            Scene.Client.Unlisten(turnIds, this);
            Scene.Done(this);
            if (error != null)
                _inbox.Fail(error);
            else
                _inbox.Put(End);
        }
    }

    /// <summary>A scene this client opened (<see cref="MythicClient.StartSceneAsync"/>) or
    /// joined (<see cref="MythicClient.JoinSceneAsync"/>): its NPCs and players as the server
    /// last said, and its lines. A message the server refuses throws a
    /// <see cref="ServerException"/> (the scene unharmed).</summary>
    public sealed class Scene
    {
        private readonly object _lock = new object();
        private SceneTalk _talk;
        private List<string> _npcs = new List<string>();
        private List<string> _players = new List<string>();

        internal Scene(MythicClient client, string sceneId)
        {
            Client = client;
            SceneId = sceneId;
        }

        internal MythicClient Client { get; }

        public string SceneId { get; }

        public IReadOnlyList<string> Npcs
        {
            get { lock (_lock) return _npcs.ToList(); }
        }

        public IReadOnlyList<string> Players
        {
            get { lock (_lock) return _players.ToList(); }
        }

        /// <summary>Why the scene ended (SceneEnd's reason); null while it is open.</summary>
        public string Ended { get; private set; }

        /// <summary>The player says <paramref name="text"/> to the scene (<paramref name="to"/>:
        /// the NPC the player faces); the NPC speaking stops.</summary>
        public Task<SceneTalk> SayAsync(string text, string to = null, string turnId = null)
        {
            turnId = turnId ?? Client.NewId("t");
            return TalkAsync(turnId, new SceneLine { SceneId = SceneId, SessionId = Client.SessionId, TurnId = turnId, Text = text, To = to });
        }

        /// <summary>The scene's NPCs talk among themselves, <paramref name="lines"/> lines (1-30),
        /// below every player's line; <paramref name="opener"/> starts, on <paramref name="topic"/>.</summary>
        public Task<SceneTalk> AmbientAsync(int lines = 6, string topic = null, string opener = null, Priority priority = Priority.Bronze, string turnId = null)
        {
            turnId = turnId ?? Client.NewId("a");
            return TalkAsync(turnId, new SceneAmbient { SceneId = SceneId, SessionId = Client.SessionId, TurnId = turnId, Lines = lines, Topic = topic, Opener = opener, Priority = priority });
        }

        /// <summary>An NPC walks in (it hears what is said from now); the scene's NPCs then.</summary>
        public async Task<IReadOnlyList<string>> JoinAsync(string npcId)
        {
            await Client.SceneCallAsync(this, "SceneJoin", new SceneJoin { SceneId = SceneId, SessionId = Client.SessionId, NpcId = npcId }).ConfigureAwait(false);
            return Npcs;
        }

        /// <summary>An NPC walks out (mid-sentence: it stops); the scene's NPCs then.</summary>
        public async Task<IReadOnlyList<string>> LeaveAsync(string npcId)
        {
            await Client.SceneCallAsync(this, "SceneLeave", new SceneLeave { SceneId = SceneId, SessionId = Client.SessionId, NpcId = npcId }).ConfigureAwait(false);
            return Npcs;
        }

        /// <summary>Ends the scene for everyone in it; waits for the server's SceneEnd.</summary>
        public Task EndAsync(string reason = null)
        {
            return Client.SceneCallAsync(this, "SceneEnd", new SceneEnd { SceneId = SceneId, SessionId = Client.SessionId, Reason = reason });
        }

        private async Task<SceneTalk> TalkAsync(string turnId, object message)
        {
            var talk = new SceneTalk(this, turnId);
            SceneTalk before;
            lock (_lock)
            {
                before = _talk;
                _talk = talk;
            }
            Client.Listen(turnId, talk);
            try
            {
                await Client.SendAsync(message).ConfigureAwait(false);
            }
            catch (MythicException)
            {
                Client.Unlisten(new List<string> { turnId }, talk);
                lock (_lock)
                    _talk = before;
                throw;
            }
            if (before != null)
                before.Stop();
            return talk;
        }

        internal void Done(SceneTalk talk)
        {
            lock (_lock)
            {
                if (_talk == talk)
                    _talk = null;
            }
        }

        internal void OnState(SceneState state)
        {
            lock (_lock)
            {
                _npcs = state.Npcs?.ToList() ?? new List<string>();
                _players = state.Players?.ToList() ?? new List<string>();
            }
        }

        internal void OnEnd(string reason)
        {
            SceneTalk talk;
            lock (_lock)
            {
                Ended = reason;
                talk = _talk;
            }
            if (talk != null)
                talk.Finish(null);
        }
    }
}
