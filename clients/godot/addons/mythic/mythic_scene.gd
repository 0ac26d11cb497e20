# A scene this client opened (`client.start_scene`) or joined (`client.join_scene`): its NPCs
# and players as the server last said, and its lines. `say` and `ambient` return a
# MythicSceneTalk at once (over at once, with its `error`, when the line could not be sent);
# `join`, `leave` and `end` are coroutines that return null (end), the scene's NPCs (join,
# leave), or a MythicError (SERVER: the server refused it, the scene unharmed).
extends Reference

const MythicSceneTalk = preload("mythic_scene_talk.gd")

var scene_id: String
var npcs := []
var players := []
# Why the scene ended (SceneEnd's reason); "" while it is open.
var ended := ""

var _client
var _talk = null
var _count := 0


func _init(client, id: String) -> void:
	_client = client
	scene_id = id


# The player says `text` to the scene (`to`: the NPC the player faces); the NPC speaking stops.
func say(text: String, to := "", turn_id := ""):
	if turn_id == "":
		turn_id = _new_id("t")
	var line := {
		"type": "SceneLine",
		"scene_id": scene_id,
		"session_id": _client.session_id,
		"turn_id": turn_id,
		"text": text,
	}
	if to != "":
		line["to"] = to
	return _talk_by(turn_id, line)


# The scene's NPCs talk among themselves, `lines` lines (1-30), below every player's line;
# `opener` starts, on `topic` when given.
func ambient(lines := 6, topic := "", opener := "", priority := "bronze", turn_id := ""):
	if turn_id == "":
		turn_id = _new_id("a")
	var cue := {
		"type": "SceneAmbient",
		"scene_id": scene_id,
		"session_id": _client.session_id,
		"turn_id": turn_id,
		"lines": lines,
		"priority": priority,
	}
	if topic != "":
		cue["topic"] = topic
	if opener != "":
		cue["opener"] = opener
	return _talk_by(turn_id, cue)


# Coroutine: an NPC walks in (it hears what is said from now); the scene's NPCs, or a MythicError.
func join(npc_id: String):
	var message := {
		"type": "SceneJoin", "scene_id": scene_id, "session_id": _client.session_id, "npc_id": npc_id
	}
	var failed = yield(_client._scene_call(self, "SceneJoin", message), "completed")
	return failed if failed != null else npcs


# Coroutine: an NPC walks out (mid-sentence: it stops); the scene's NPCs, or a MythicError.
func leave(npc_id: String):
	var message := {
		"type": "SceneLeave", "scene_id": scene_id, "session_id": _client.session_id, "npc_id": npc_id
	}
	var failed = yield(_client._scene_call(self, "SceneLeave", message), "completed")
	return failed if failed != null else npcs


# Coroutine: ends the scene for everyone in it, waiting for the server's SceneEnd; null, or a
# MythicError.
func end(reason := ""):
	var message := {"type": "SceneEnd", "scene_id": scene_id, "session_id": _client.session_id}
	if reason != "":
		message["reason"] = reason
	return yield(_client._scene_call(self, "SceneEnd", message), "completed")


func _talk_by(turn_id: String, message: Dictionary):
	var talk = MythicSceneTalk.new(self, turn_id)
	var before = _talk
	_client._scene_talks[turn_id] = talk
	_talk = talk
	var refused = _client.send(message)
	if refused != null:
		_talk = before
		talk._fail(refused)
		return talk
	if before != null:
		before._stop()
	return talk


func _new_id(prefix: String) -> String:
	_count += 1
	return "%s-%d-%d" % [prefix, OS.get_unix_time(), _count]


func _on_state(message: Dictionary) -> void:
	npcs = message.get("npcs", [])
	players = message.get("players", [])


func _on_end(reason: String) -> void:
	ended = reason
	if _talk != null:
		_talk._finish()
