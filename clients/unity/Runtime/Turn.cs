using System;
using System.Collections.Generic;
using System.Text;
using System.Threading;
using System.Threading.Tasks;

namespace Mythic.Client
{
    /// <summary>One player line and everything the NPC sends back for it.
    /// <c>await foreach (var e in turn)</c> gives its events in the order the server sent them
    /// (or call <see cref="NextAsync"/>); <see cref="TextStream"/> gives the reply's text as it
    /// streams. The events end with the reply (a final delta that is not <c>tool_call</c>); a
    /// <see cref="ConnectionLostException"/> ends them when the connection drops first, a
    /// <see cref="WaitTimeoutException"/> when the server sends nothing for the turn within the
    /// client's timeout.</summary>
    public sealed class Turn : IAsyncEnumerable<ITurnEvent>
    {
        private readonly MythicClient _client;
        private readonly List<LlmStreamDelta> _deltas = new List<LlmStreamDelta>();
        private readonly List<ToolCall> _toolCalls = new List<ToolCall>();
        private readonly List<Error> _errors = new List<Error>();
        private readonly List<Cutoff> _cutoffs = new List<Cutoff>();

        internal Turn(MythicClient client, string npcId, string turnId)
        {
            _client = client;
            NpcId = npcId;
            TurnId = turnId;
        }

        internal Inbox<ITurnEvent> Inbox { get; } = new Inbox<ITurnEvent>();

        public string NpcId { get; }

        public string TurnId { get; }

        /// <summary>The deltas, tool calls, errors and Cutoffs read so far.</summary>
        public IReadOnlyList<LlmStreamDelta> Deltas => _deltas;

        public IReadOnlyList<ToolCall> ToolCalls => _toolCalls;

        public IReadOnlyList<Error> Errors => _errors;

        public IReadOnlyList<Cutoff> Cutoffs => _cutoffs;

        /// <summary>Why the reply ended (<c>Stop</c>, <c>Length</c>, <c>Cutoff</c>, <c>Error</c>);
        /// null while it goes on.</summary>
        public FinishReason? FinishReason { get; private set; }

        /// <summary>Whether the turn is over (its reply ended, or it failed).</summary>
        public bool Over { get; private set; }

        /// <summary>The reply text so far: the deltas joined, a space after the part before a tool
        /// call.</summary>
        public string Text
        {
            get
            {
                var text = new StringBuilder();
                var gap = false;
                foreach (var d in _deltas)
                {
                    var piece = d.Delta ?? "";
                    if (gap && text.Length > 0 && piece.Length > 0 && !char.IsWhiteSpace(text[text.Length - 1]) && !char.IsWhiteSpace(piece[0]))
                        text.Append(' ');
                    text.Append(piece);
                    if (piece.Length > 0 || d.Final == true)
                        gap = d.Final == true && d.FinishReason == Client.FinishReason.ToolCall;
                }
                return text.ToString();
            }
        }

        /// <summary>The turn's next event; null once the reply has ended.</summary>
        /// <exception cref="ConnectionLostException">The connection dropped first.</exception>
        /// <exception cref="WaitTimeoutException">Nothing for the turn within the client's timeout.</exception>
        public async Task<ITurnEvent> NextAsync(CancellationToken cancel = default(CancellationToken))
        {
            if (Over)
                return null;
            ITurnEvent e;
            try
            {
                e = await Inbox.TakeAsync(_client.Timeout, "message for turn " + TurnId, cancel).ConfigureAwait(false);
            }
            catch (MythicException)
            {
                Finish();
                throw;
            }
            var delta = e as LlmStreamDelta;
            if (delta != null)
            {
                _deltas.Add(delta);
                if (delta.Final == true && delta.FinishReason != Client.FinishReason.ToolCall)
                {
                    FinishReason = delta.FinishReason;
                    Finish();
                }
            }
            else if (e is ToolCall)
            {
                _toolCalls.Add((ToolCall)e);
            }
            else if (e is Cutoff)
            {
                _cutoffs.Add((Cutoff)e);
            }
            else if (e is Error)
            {
                _errors.Add((Error)e);
            }
            return e;
        }

        public IAsyncEnumerator<ITurnEvent> GetAsyncEnumerator(CancellationToken cancel = default(CancellationToken))
        {
            return new Stream<ITurnEvent>(this, e => e, cancel);
        }

        /// <summary>The reply's text, piece by piece as it streams.</summary>
        public IAsyncEnumerable<string> TextStream()
        {
            return new Pieces(this);
        }

        /// <summary>Waits for the end of the turn; the whole reply text.</summary>
        public async Task<string> ReplyAsync(CancellationToken cancel = default(CancellationToken))
        {
            while (await NextAsync(cancel).ConfigureAwait(false) != null) { }
            return Text;
        }

        /// <summary>Stops the NPC (the player interrupted); the turn ends with finish reason
        /// <c>Cutoff</c>.</summary>
        public Task CutoffAsync(Reason reason = Reason.BargeIn)
        {
            return _client.SendAsync(new Cutoff { NpcId = NpcId, SessionId = _client.SessionId, TurnId = TurnId, Reason = reason });
        }

        private void Finish()
        {
            Over = true;
            _client.Forget(TurnId);
        }

        private sealed class Pieces : IAsyncEnumerable<string>
        {
            private readonly Turn _turn;

            internal Pieces(Turn turn)
            {
                _turn = turn;
            }

            public IAsyncEnumerator<string> GetAsyncEnumerator(CancellationToken cancel = default(CancellationToken))
            {
                return new Stream<string>(_turn, e =>
                {
                    var delta = e as LlmStreamDelta;
                    return delta != null && !string.IsNullOrEmpty(delta.Delta) ? delta.Delta : null;
                }, cancel);
            }
        }

        /// <summary>The turn's events, each mapped by <c>pick</c> (null: skipped).</summary>
        private sealed class Stream<T> : IAsyncEnumerator<T>
            where T : class
        {
            private readonly Turn _turn;
            private readonly Func<ITurnEvent, T> _pick;
            private readonly CancellationToken _cancel;

            internal Stream(Turn turn, Func<ITurnEvent, T> pick, CancellationToken cancel)
            {
                _turn = turn;
                _pick = pick;
                _cancel = cancel;
            }

            public T Current { get; private set; }

            public async ValueTask<bool> MoveNextAsync()
            {
                while (true)
                {
                    var e = await _turn.NextAsync(_cancel).ConfigureAwait(false);
                    if (e == null)
                        return false;
                    Current = _pick(e);
                    if (Current != null)
                        return true;
                }
            }

            public ValueTask DisposeAsync()
            {
                return default(ValueTask);
            }
        }
    }
}
