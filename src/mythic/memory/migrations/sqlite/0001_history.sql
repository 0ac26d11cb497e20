-- The lifetime history of every NPC×player: append-only, one row per event.
CREATE TABLE memory_events (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    event_id TEXT NOT NULL UNIQUE,          -- idempotency: a replayed event is stored once
    kind TEXT NOT NULL,                     -- turn, event, summary, fact, card, emotion
    npc_id TEXT NOT NULL,
    player_id TEXT NOT NULL,
    session_id TEXT,
    role TEXT,
    ts REAL NOT NULL,                       -- seconds since the epoch, from the game's clock
    text TEXT NOT NULL DEFAULT '',
    data TEXT,                              -- JSON
    archived_at REAL NOT NULL DEFAULT ((julianday('now') - 2440587.5) * 86400.0)
);
-- Episodic queries: one NPC with one player over time; everything of a player; by kind.
CREATE INDEX memory_events_npc_player_ts ON memory_events (npc_id, player_id, ts);
CREATE INDEX memory_events_player_ts ON memory_events (player_id, ts);
CREATE INDEX memory_events_kind_ts ON memory_events (kind, ts);
