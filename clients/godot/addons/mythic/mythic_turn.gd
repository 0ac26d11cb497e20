# One player line and everything the NPC sends back for it: LLMStreamDelta, ToolCall, Cutoff
# and Error messages, in the order the server sent them.
#
# Listen to its signals, or wait in a coroutine: `yield(turn.next_event(), "completed")` for
# each event in order, `yield(turn.reply(), "completed")` for the whole reply. The turn is over
# with the reply (a final delta whose finish_reason is not tool_call), or when it fails: the
# connection dropped (`error.kind` CONNECTION_LOST), the server sent nothing for it within the
# client's timeout_s (TIMEOUT), or its line was refused before it was sent (VALIDATION, USAGE).
extends Reference

# A piece of the reply's text as it streams (`message` is the LLMStreamDelta).
signal delta(text, message)
signal tool_call(message)
signal cutoff(message)
# The server's Error message for this turn (the turn ends with a final delta after it).
signal server_error(message)
# The turn is over: `finish_reason` is set, or `error` says why it failed.
signal finished(turn)

const MythicError = preload("mythic_error.gd")
const Wait = preload("mythic_wait.gd")

var npc_id: String
var turn_id: String
var deltas := []
var tool_calls := []
var errors := []
var cutoffs := []
# Why the reply ended (stop, length, cutoff, error); "" while it goes on or when it failed.
var finish_reason := ""
# Why the turn failed (a MythicError), or null.
var error = null
var over := false

var _client
var _unread := []
var _last_heard_ms := OS.get_ticks_msec()


func _init(client, npc: String, id: String) -> void:
	_client = client
	npc_id = npc
	turn_id = id


# The reply text so far: the deltas joined, a space after the part before a tool call.
func text() -> String:
	var out := ""
	var gap := false
	for d in deltas:
		var piece: String = d["delta"]
		if gap and out != "" and piece != "" and not _space(out[-1]) and not _space(piece[0]):
			out += " "
		out += piece
		if piece != "" or d.get("final", false):
			gap = d.get("final", false) and d.get("finish_reason") == "tool_call"
	return out


# Coroutine: the next event of the turn in order (a message Dictionary); null once the turn is
# over and every event was taken; the turn's `error` when it failed.
func next_event():
	var read = yield(
		Wait.until(self, "_readable", _client.timeout_s, "message for turn " + turn_id), "completed"
	)
	if read is MythicError:  # the client fails a silent turn itself; this bounds the wait too
		_fail(read)
	if not _unread.empty():
		return _unread.pop_front()
	return error


# Coroutine: waits for the end of the turn; the whole reply text, or the turn's `error`.
func reply():
	while true:
		var event = yield(next_event(), "completed")
		if event == null:
			return text()
		if event is MythicError:
			return event


# Stops the NPC (the player interrupted): the turn ends with finish_reason cutoff. Null when
# sent, else a MythicError.
func cut_off(reason := "barge_in"):
	return _client.send(
		{
			"type": "Cutoff",
			"npc_id": npc_id,
			"session_id": _client.session_id,
			"turn_id": turn_id,
			"reason": reason,
		}
	)


func _readable() -> bool:
	return not _unread.empty() or over


# The client hands over each message of the turn as it arrives.
func _receive(message: Dictionary) -> void:
	_last_heard_ms = OS.get_ticks_msec()
	_unread.append(message)
	match message["type"]:
		"LLMStreamDelta":
			deltas.append(message)
			if message["delta"] != "":
				emit_signal("delta", message["delta"], message)
			if message.get("final", false) and message.get("finish_reason") != "tool_call":
				finish_reason = str(message.get("finish_reason", ""))
				_finish()
		"ToolCall":
			tool_calls.append(message)
			emit_signal("tool_call", message)
		"Cutoff":
			cutoffs.append(message)
			emit_signal("cutoff", message)
		"Error":
			errors.append(message)
			emit_signal("server_error", message)


# Whether the server has been silent on this turn for longer than `timeout_s`.
func _silent_for(timeout_s: float) -> bool:
	return not over and OS.get_ticks_msec() - _last_heard_ms > timeout_s * 1000


func _fail(why: MythicError) -> void:
	if over:
		return
	why.turn_id = turn_id
	error = why
	_finish()


func _finish() -> void:
	over = true
	_client._forget(turn_id)
	emit_signal("finished", self)


static func _space(character: String) -> bool:
	return character in [" ", "\t", "\n", "\r"]
