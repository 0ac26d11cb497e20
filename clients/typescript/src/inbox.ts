// A bounded queue with a bounded wait: what a turn, a scene line and the client's events read.
import { type MythicError, WaitTimeoutError } from "./errors.js";

/** @internal A queue with bounded waits: what a turn, a scene line or the client's event stream hands out. */
export class Inbox<T> {
  private items: ({ item: T } | { error: MythicError })[] = [];
  private waiter: (() => void) | null = null;

  constructor(private readonly limit = Infinity) {}

  put(item: T): void {
    this.push({ item });
  }

  /** The next `take` throws `error`. */
  fail(error: MythicError): void {
    this.push({ error });
  }

  private push(entry: { item: T } | { error: MythicError }): void {
    if (this.items.length >= this.limit) this.items.shift();
    this.items.push(entry);
    this.waiter?.();
  }

  async take(timeoutMs: number, what: string): Promise<T> {
    if (this.items.length === 0) {
      let timer: ReturnType<typeof setTimeout> | undefined;
      try {
        await new Promise<void>((resolve, reject) => {
          this.waiter = resolve;
          timer = setTimeout(
            () => reject(new WaitTimeoutError(`no ${what} within ${timeoutMs} ms`)),
            timeoutMs,
          );
        });
      } finally {
        this.waiter = null;
        clearTimeout(timer);
      }
    }
    const entry = this.items.shift()!;
    if ("error" in entry) throw entry.error;
    return entry.item;
  }
}
