-- When each event happened in the game's own calendar: minutes since its first day (the
-- game's SceneUpdate.date and .time), NULL when the game never told the date. Memories
-- fade, and "yesterday" is said, by this clock when both ends have it.
ALTER TABLE memory_events ADD COLUMN game_time INTEGER;
