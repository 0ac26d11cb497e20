using System;
using System.Collections.Generic;
using System.Threading;
using System.Threading.Tasks;

namespace Mythic.Client
{
    /// <summary>A queue with bounded waits, for one reader: what a turn or the client's event
    /// stream hands out. Put and Fail may come from any thread.</summary>
    internal sealed class Inbox<T>
    {
        private readonly Queue<KeyValuePair<T, Exception>> _items = new Queue<KeyValuePair<T, Exception>>();
        private readonly int _limit;
        private TaskCompletionSource<bool> _waiter;

        internal Inbox(int limit = int.MaxValue)
        {
            _limit = limit;
        }

        internal void Put(T item)
        {
            Push(new KeyValuePair<T, Exception>(item, null));
        }

        /// <summary>The next Take throws <paramref name="error"/>.</summary>
        internal void Fail(Exception error)
        {
            Push(new KeyValuePair<T, Exception>(default(T), error));
        }

        private void Push(KeyValuePair<T, Exception> entry)
        {
            TaskCompletionSource<bool> waiter;
            lock (_items)
            {
                if (_items.Count >= _limit)
                    _items.Dequeue();
                _items.Enqueue(entry);
                waiter = _waiter;
                _waiter = null;
            }
            // Outside the lock, and the reader resumes on another thread (not inside Push).
            if (waiter != null)
                waiter.TrySetResult(true);
        }

        /// <exception cref="WaitTimeoutException">Nothing came within <paramref name="timeout"/>.</exception>
        internal async Task<T> TakeAsync(TimeSpan timeout, string what, CancellationToken cancel = default(CancellationToken))
        {
            var deadline = DateTime.UtcNow + timeout;
            while (true)
            {
                TaskCompletionSource<bool> waiter;
                lock (_items)
                {
                    if (_items.Count > 0)
                    {
                        var entry = _items.Dequeue();
                        if (entry.Value != null)
                            throw entry.Value;
                        return entry.Key;
                    }
                    waiter = _waiter = new TaskCompletionSource<bool>(TaskCreationOptions.RunContinuationsAsynchronously);
                }
                var left = deadline - DateTime.UtcNow;
                if (left <= TimeSpan.Zero)
                    throw new WaitTimeoutException("no " + what + " within " + timeout.TotalSeconds + " s");
                using (var stop = CancellationTokenSource.CreateLinkedTokenSource(cancel))
                {
                    var timer = Task.Delay(left, stop.Token);
                    if (await Task.WhenAny(waiter.Task, timer).ConfigureAwait(false) == timer)
                    {
                        cancel.ThrowIfCancellationRequested();
                        bool empty;
                        lock (_items)
                        {
                            if (_waiter == waiter)
                                _waiter = null;
                            empty = _items.Count == 0;
                        }
                        if (empty)
                            throw new WaitTimeoutException("no " + what + " within " + timeout.TotalSeconds + " s");
                    }
                    stop.Cancel();
                }
            }
        }
    }
}
