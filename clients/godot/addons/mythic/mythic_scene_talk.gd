# A line said to a scene (the player's, or the game's cue for NPCs talking among themselves)
# and every reply it gets, in order, as the scene announces them (SceneTurn messages). It is
# over when the scene says nobody answers the last reply, when the line is refused (`errors`),
# when a new line to the scene stopped it (its reply then ends cutoff), when the scene ends,
# or when it fails (`error`: CONNECTION_LOST, TIMEOUT, VALIDATION).
#
# Listen to its signals, or wait in a coroutine: `yield(talk.next_event(), "completed")` for
# each event (SceneTurn, LLMStreamDelta, ToolCall, Error) in order, `yield(talk.wait(),
# "completed")` for all of it. Each reply is a Dictionary: npc_id, turn_id, deltas,
# finish_reason ("" while it streams); `reply_text(reply)` joins its deltas.
extends Reference

# Who answers next: `message` is the SceneTurn (no speakers: nobody, the line is answered).
signal turn(message)
# A piece of a reply's text as it streams.
signal delta(npc_id, text, message)
# It is over.
signal finished(talk)

const MythicError = preload("mythic_error.gd")
const Wait = preload("mythic_wait.gd")

var turn_id: String
var replies := []
var turns := []
var errors := []
# Why it failed (a MythicError), or null.
var error = null
var over := false

var _scene
var _open := {}
var _stopped := false
var _unread := []


func _init(scene, id: String) -> void:
	_scene = scene
	turn_id = id


# Who answered, in order.
func speakers() -> Array:
	var out := []
	for reply in replies:
		out.append(reply["npc_id"])
	return out


static func reply_text(reply: Dictionary) -> String:
	var out := ""
	for d in reply["deltas"]:
		out += d["delta"]
	return out


# Coroutine: the next event in order (a message Dictionary); null once it is over and every
# event was taken; its `error` when it failed.
func next_event():
	var read = yield(
		Wait.until(self, "_readable", _scene._client.timeout_s, "message for scene line " + turn_id),
		"completed"
	)
	if read is MythicError:
		_fail(read)
	if not _unread.empty():
		return _unread.pop_front()
	return error


# Coroutine: waits until it is over; itself, or its `error`.
func wait():
	while true:
		var event = yield(next_event(), "completed")
		if event == null:
			return self
		if event is MythicError:
			return event


func _readable() -> bool:
	return not _unread.empty() or over


func _on_turn(message: Dictionary) -> void:
	turns.append(message)
	var ids: Array = message["turn_ids"]
	for i in range(message["speakers"].size()):
		var reply := {
			"npc_id": message["speakers"][i], "turn_id": ids[i], "deltas": [], "finish_reason": ""
		}
		replies.append(reply)
		_open[ids[i]] = reply
		_scene._client._scene_talks[ids[i]] = self
	_unread.append(message)
	emit_signal("turn", message)
	if message["speakers"].empty():
		_finish()


func _on_delta(message: Dictionary) -> void:
	var reply = _open.get(message["turn_id"])
	if reply == null:
		return
	reply["deltas"].append(message)
	_unread.append(message)
	if message["delta"] != "":
		emit_signal("delta", reply["npc_id"], message["delta"], message)
	if message.get("final", false) and message.get("finish_reason") != "tool_call":
		reply["finish_reason"] = str(message.get("finish_reason", ""))
		_open.erase(message["turn_id"])
		if _stopped and _open.empty():
			_finish()


func _on_event(message: Dictionary) -> void:
	_unread.append(message)
	if message["type"] == "Error":
		errors.append(message)
		if message.get("turn_id") == turn_id and replies.empty():
			_finish()  # the line was refused


# A new line to the scene stopped this one: over once its reply in flight ends.
func _stop() -> void:
	_stopped = true
	if _open.empty():
		_finish()


func _fail(why: MythicError) -> void:
	if over:
		return
	why.turn_id = turn_id
	error = why
	_finish()


func _finish() -> void:
	if over:
		return
	over = true
	var talks: Dictionary = _scene._client._scene_talks
	var ids := [turn_id]
	for reply in replies:
		ids.append(reply["turn_id"])
	for id in ids:
		if talks.get(id) == self:
			talks.erase(id)
	if _scene._talk == self:
		_scene._talk = null
	emit_signal("finished", self)
