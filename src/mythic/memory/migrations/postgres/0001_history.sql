-- The lifetime history of every NPC×player: append-only, one row per event.
CREATE TABLE memory_events (
    seq BIGSERIAL PRIMARY KEY,
    event_id TEXT NOT NULL UNIQUE,          -- idempotency: a replayed event is stored once
    kind TEXT NOT NULL,                     -- turn, event, summary, fact, card, emotion
    npc_id TEXT NOT NULL,
    player_id TEXT NOT NULL,
    session_id TEXT,
    role TEXT,
    ts DOUBLE PRECISION NOT NULL,           -- seconds since the epoch, from the game's clock
    text TEXT NOT NULL DEFAULT '',
    data JSONB,
    archived_at TIMESTAMPTZ NOT NULL DEFAULT now()
);
-- Episodic queries: one NPC with one player over time; everything of a player; by kind.
CREATE INDEX memory_events_npc_player_ts ON memory_events (npc_id, player_id, ts);
CREATE INDEX memory_events_player_ts ON memory_events (player_id, ts);
CREATE INDEX memory_events_kind_ts ON memory_events (kind, ts);
