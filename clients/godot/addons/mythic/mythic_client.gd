# A game's connection to a Mythic server (the v1 protocol over a WebSocket).
#
#     var client = MythicClient.new()        # preload("res://addons/mythic/mythic_client.gd")
#     client.url = "ws://127.0.0.1:8765/v1/ws"
#     add_child(client)                      # it polls its socket every frame
#     var welcome = yield(client.connect_to_server(), "completed")
#     var turn = client.say("marla", "Is the tavern open?")
#     turn.connect("delta", self, "_on_npc_text")
#     var text = yield(turn.reply(), "completed")
#
# Failures are values, never script errors: a MythicError returned, held by a turn, or sent
# with the `event` signal. The client reconnects by itself with bounded backoff and resumes its
# session (the NPCs keep their history); a turn in flight when the connection drops ends with a
# CONNECTION_LOST error. Every wait is bounded by `timeout_s`.
extends Node

# A session was opened or resumed: `welcome` is the server's Welcome.
signal connected(welcome)
# The connection dropped; the client resumes the session unless it was told to stop.
signal connection_lost(error)
# A message of no turn (NPCState, a pushed IntentUpdate, an Error, a TTSChunk), or a MythicError
# of no turn (a frame this client could not read, a reconnect given up, an Ack not sent).
signal event(item)
# A TTSChunk of the NPC's voice (JSON or binary frame): `pcm` in base64 (Protocol.pcm_of) and
# its `visemes` for lip-sync (MythicLipSync).
signal tts_chunk(chunk)

const MythicError = preload("mythic_error.gd")
const MythicScene = preload("mythic_scene.gd")
const MythicTurn = preload("mythic_turn.gd")
const Protocol = preload("mythic_protocol.gd")
const Socket = preload("mythic_socket.gd")
const Wait = preload("mythic_wait.gd")
# Tool calls remembered for idempotent Acks: a call sent again within these is not run again.
const REMEMBERED_CALLS = 256
# Frames kept to send while the client reconnects.
const MAX_QUEUED_FRAMES = 256

# The server's WebSocket URL.
export var url := "ws://127.0.0.1:8765/v1/ws"
# The player the session belongs to ("" for none).
export var player_id := ""
# The bound on every wait: connecting, an answer, the next event of a turn.
export var timeout_s := 30.0
# Reconnect and resume the session when the connection drops.
export var reconnect := true
# First wait before reconnecting, doubled after each failed try up to max_backoff_s.
export var backoff_s := 0.1
export var max_backoff_s := 5.0
# Tries before the client gives up reconnecting (and reports a CONNECTION_LOST error).
export var max_reconnects := 10
# Events of no turn kept for `next_event`; the oldest are dropped beyond it.
export var max_events := 1024

# The session talks by voice: its VoiceFormat ({"input_rate": 16000, "binary": true}), or null.
var voice = null
# Runs each game tool the NPC calls, once per call_id: a FuncRef taking the ToolCall message and
# returning {"status": "ok"|"error"|"rejected", "result": {...}, "message": "..."} (or a
# coroutine's state that completes with it). Without one, answer calls with `ack`.
var tool_handler: FuncRef = null
# The session's id, once connected.
var session_id := ""
# How many times the session was resumed (after a drop, or disconnect then connect).
var resumes := 0

var _protocol := Protocol.new()
var _socket = null  # the connection in use (welcomed), or null
var _sockets := []  # every socket still to poll: in use, connecting, closing
var _resume_token := ""
var _stopped := true
var _resuming := false
var _turns := {}
var _scenes := {}
var _scene_talks := {}  # the open MythicSceneTalk of each line and reply turn id
var _scene_calls := []  # scene messages waiting for the scene's state: {kind, scene, result, done}
var _intents := {}
var _calls := {}
var _call_order := []
var _events := []
var _queued := []
var _turn_count := 0


func _process(_delta: float) -> void:
	for socket in _sockets.duplicate():
		socket.poll()
		if socket.is_done():
			_sockets.erase(socket)
	for turn in _turns.values():
		if turn._silent_for(timeout_s):
			turn._fail(Wait.timeout("message for turn %s" % turn.turn_id, timeout_s))


# -- lifecycle --------------------------------------------------------------------------------


# Coroutine: connects and opens the session, or resumes it after `disconnect_from_server`.
# The server's Welcome, or a MythicError (SERVER: refused; CONNECTION_LOST; TIMEOUT; USAGE:
# connected already).
func connect_to_server():
	if _socket != null:
		yield(Engine.get_main_loop(), "idle_frame")
		return MythicError.new(
			MythicError.USAGE, "connected", "connected already: disconnect first"
		)
	_stopped = false
	var result = yield(_open(), "completed")
	if result is MythicError:
		_stopped = true
	return result


# Coroutine: closes the connection without ending the session; `connect_to_server` resumes it.
func disconnect_from_server():
	_stopped = true
	return yield(_close_socket(), "completed")


# Coroutine: ends the session (SessionEnd) and closes the connection.
func close():
	if _socket != null and session_id != "":
		_socket.send_text(
			to_json(
				{
					"schema_version": Protocol.SCHEMA_VERSION,
					"type": "SessionEnd",
					"session_id": session_id
				}
			)
		)
	_stopped = true
	_queued.clear()
	return yield(_close_socket(), "completed")


# Whether the client is connected and welcomed now.
func is_connected_to_server() -> bool:
	return _socket != null


# The socket of the current connection (MythicSocket), for diagnostics and tests; or null.
func get_socket():
	return _socket


# Closes the socket in use; its `closed` ends the turns in flight (`_lost`), and no resume
# follows once `_stopped` is set.
func _close_socket():
	var socket = _socket
	if socket == null or socket.is_done():
		yield(Engine.get_main_loop(), "idle_frame")
		return null
	socket.close(1000)
	var closed = yield(
		Wait.until(socket, "is_done", timeout_s, "close of the connection"), "completed"
	)
	if _socket == socket:
		socket.abort()
		_lost()
	return closed if closed is MythicError else null


func _open():
	var socket = Socket.new()
	var attempt := {"socket": socket, "result": null}
	socket.connect("opened", self, "_on_opened", [attempt])
	socket.connect("received", self, "_on_received", [attempt])
	socket.connect("closed", self, "_on_closed", [attempt])
	_sockets.append(socket)
	var started: int = socket.open(url)
	if started != OK:
		_sockets.erase(socket)
		yield(Engine.get_main_loop(), "idle_frame")
		return _connection_lost("cannot connect to %s (error %d)" % [url, started])
	var waited = yield(
		Wait.until(self, "_settled", timeout_s, "Welcome from " + url, [attempt]), "completed"
	)
	if waited is MythicError:
		socket.abort()
		attempt["result"] = waited
	return attempt["result"]


func _settled(attempt: Dictionary) -> bool:
	return attempt["result"] != null


func _on_opened(attempt: Dictionary) -> void:
	var start := {"type": "SessionStart"}
	if player_id != "":
		start["player_id"] = player_id
	if _resume_token != "":
		start["session_id"] = session_id
		start["resume_token"] = _resume_token
	if voice != null:
		start["voice"] = voice
	var checked = _protocol.check_outgoing(start)
	if checked is MythicError:
		attempt["result"] = checked
		attempt["socket"].close()
		return
	attempt["socket"].send_text(to_json(checked))


func _on_received(data: PoolByteArray, is_text: bool, attempt: Dictionary) -> void:
	var message
	if is_text:
		message = _protocol.parse_server_frame(data.get_string_from_utf8())
	else:
		message = _protocol.decode_audio_frame(data)
	if message is MythicError:
		_report(message)
		return
	if attempt["result"] == null and message["type"] == "Welcome":
		_welcomed(attempt, message)
	elif attempt["result"] == null and message["type"] == "Error":
		var refused := MythicError.new(
			MythicError.SERVER,
			message["code"],
			message["message"],
			str(message.get("ref", "")),
			message.get("retryable", false)
		)
		refused.error = message
		attempt["result"] = refused
		attempt["socket"].close()
	else:
		_route(message)


func _welcomed(attempt: Dictionary, welcome: Dictionary) -> void:
	_socket = attempt["socket"]
	session_id = welcome["session_id"]
	_resume_token = welcome["resume_token"]
	if welcome.get("resumed", false):
		resumes += 1
	attempt["result"] = welcome
	var queued := _queued
	_queued = []
	for frame in queued:
		_write(frame)
	emit_signal("connected", welcome)


func _on_closed(_clean: bool, attempt: Dictionary) -> void:
	if attempt["result"] == null:
		attempt["result"] = _connection_lost("the connection to %s closed before Welcome" % url)
	elif attempt["socket"] == _socket:
		_lost()


# The connection is gone: fail the turns and intents in flight, then resume unless stopped.
func _lost() -> void:
	_socket = null
	var why := _connection_lost("the connection to %s dropped" % url)
	for turn in _turns.values():
		turn._fail(_connection_lost("connection lost during turn %s" % turn.turn_id))
	_turns.clear()
	for request in _intents.values():
		request["result"] = why
	var talks := {}
	for talk in _scene_talks.values():
		talks[talk] = true
	for talk in talks:
		talk._fail(_connection_lost("connection lost during scene line %s" % talk.turn_id))
	_scene_talks.clear()
	for call in _scene_calls:
		call["result"] = why
		call["done"] = true
	emit_signal("connection_lost", why)
	if not _stopped and reconnect and not _resuming:
		_resume()


func _resume():
	_resuming = true
	var backoff := backoff_s
	var tries := 0
	while tries < max_reconnects and not _stopped:
		tries += 1
		yield(Wait.sleep(backoff), "completed")
		if _stopped:
			break
		var result = yield(_open(), "completed")
		if not result is MythicError:
			_resuming = false
			return
		if result.kind == MythicError.SERVER and result.code == "unknown_session":
			_resume_token = ""  # the session expired: open a fresh one
		else:
			backoff = min(max_backoff_s, backoff * 2)
	_resuming = false
	if not _stopped:
		_stopped = true
		_queued.clear()
		_report(_connection_lost("gave up reconnecting to %s after %d tries" % [url, tries]))


# -- sending ----------------------------------------------------------------------------------


# Sends a message after checking it against the v1 schema (`schema_version` may be left out).
# Null when sent (or queued while the client reconnects), else a MythicError: VALIDATION (the
# message breaks the schema; nothing was sent) or USAGE (not connected).
func send(message: Dictionary):
	var checked = _protocol.check_outgoing(message)
	if checked is MythicError:
		return checked
	return _write(to_json(checked))


# Sends a frame as it is (a String: text; a PoolByteArray: binary), past the schema check: for
# conformance tests and debugging a server, never for game messages.
func send_raw(frame):
	return _write(frame)


func _write(frame):
	if _socket == null:
		if _stopped:
			return MythicError.new(MythicError.USAGE, "not_connected", "connect_to_server() first")
		if _queued.size() >= MAX_QUEUED_FRAMES:
			return _connection_lost("reconnecting, and %d frames wait already" % MAX_QUEUED_FRAMES)
		_queued.append(frame)
		return null
	var sent: int = (
		_socket.send_text(frame)
		if typeof(frame) == TYPE_STRING
		else _socket.send_binary(frame)
	)
	if sent != OK:
		return _connection_lost("the frame was not sent (error %d)" % sent)
	return null


# Says `text` to an NPC: the turn of its reply (a MythicTurn). A turn whose line could not be
# sent is over at once, with its `error` set.
func say(npc_id: String, text: String, turn_id := ""):
	if turn_id == "":
		_turn_count += 1
		turn_id = "t-%d-%d" % [OS.get_unix_time(), _turn_count]
	var turn = MythicTurn.new(self, npc_id, turn_id)
	_turns[turn_id] = turn
	var line := {
		"type": "PlayerUtterance",
		"npc_id": npc_id,
		"session_id": session_id,
		"turn_id": turn_id,
		"text": text
	}
	if player_id != "":
		line["player_id"] = player_id
	var refused = send(line)
	if refused != null:
		turn._fail(refused)
	return turn


# Tells an NPC what it perceives now: `zone`, `time` ("HH:MM"), `objects` (id -> distance) and
# the game's `date` ("year-month-day" in the world's calendar); an empty zone, time or date or
# null objects stay as they were. Null when sent, else a MythicError.
func scene(npc_id: String, zone := "", time := "", objects = null, date := ""):
	var update := {"type": "SceneUpdate", "npc_id": npc_id}
	if zone != "":
		update["zone"] = zone
	if time != "":
		update["time"] = time
	if date != "":
		update["date"] = date
	if objects != null:
		var listed := []
		for id in objects:
			listed.append({"id": id, "dist": objects[id]})
		update["objects"] = listed
	return send(update)


# Coroutine: asks for an NPC's intent (the game's intent cache) and waits for it. The
# IntentUpdate, or a MythicError (VALIDATION, CONNECTION_LOST, TIMEOUT).
func intent(npc_id: String, context := "", with_bark := false, request_id := ""):
	if request_id == "":
		_turn_count += 1
		request_id = "i-%d-%d" % [OS.get_unix_time(), _turn_count]
	var request := {
		"type": "IntentRequest", "npc_id": npc_id, "request_id": request_id, "with_bark": with_bark
	}
	if context != "":
		request["context"] = context
	var waiting := {"result": null}
	_intents[request_id] = waiting
	var refused = send(request)
	if refused != null:
		waiting["result"] = refused
	var waited = yield(
		Wait.until(self, "_settled", timeout_s, "IntentUpdate for " + request_id, [waiting]),
		"completed"
	)
	_intents.erase(request_id)
	return waited if waited is MythicError else waiting["result"]


# -- scenes ---------------------------------------------------------------------------------


# Coroutine: opens a scene of `npcs` with this client's player in it; the player's lines to it
# (`scene.say`) are answered by the NPC they name, else the one the player faces, else the
# scene's choice. The MythicScene, or a MythicError (SERVER: an unknown NPC, a duplicate, too
# many; TIMEOUT).
func start_scene(scene_id: String, npcs: Array, max_exchanges := -1):
	var scene = MythicScene.new(self, scene_id)
	var message := {
		"type": "SceneStart", "scene_id": scene_id, "session_id": session_id, "npcs": npcs
	}
	if max_exchanges >= 0:
		message["max_exchanges"] = max_exchanges
	var failed = yield(_scene_call(scene, "SceneStart", message), "completed")
	return failed if failed != null else scene


# Coroutine: this client's player joins a scene another player opened (it hears what follows).
# The MythicScene, or a MythicError (SERVER: no such scene, or it has ended).
func join_scene(scene_id: String):
	var scene = MythicScene.new(self, scene_id)
	var message := {"type": "SceneJoin", "scene_id": scene_id, "session_id": session_id}
	var failed = yield(_scene_call(scene, "SceneJoin", message), "completed")
	return failed if failed != null else scene


# Coroutine: sends a scene message and waits for the scene's state (or end) that answers it;
# null, or a MythicError.
func _scene_call(scene, kind: String, message: Dictionary):
	var opening := not _scenes.has(scene.scene_id)
	if opening:
		_scenes[scene.scene_id] = scene
	var waiting := {"kind": kind, "scene": scene, "result": null, "done": false}
	_scene_calls.append(waiting)
	var refused = send(message)
	if refused != null:
		waiting["result"] = refused
		waiting["done"] = true
	var waited = yield(
		Wait.until(self, "_scene_answered", timeout_s, "answer to " + kind, [waiting]), "completed"
	)
	_scene_calls.erase(waiting)
	var failed = waited if waited is MythicError else waiting["result"]
	if failed != null and opening and scene.npcs.empty() and _scenes.get(scene.scene_id) == scene:
		_scenes.erase(scene.scene_id)
	return failed


func _scene_answered(waiting: Dictionary) -> bool:
	return waiting["done"]


# Hands a scene or a scene line its messages; true when one took it.
func _route_scene(message: Dictionary) -> bool:
	var type: String = message["type"]
	if type == "SceneState" or type == "SceneEnd":
		var scene = _scenes.get(message["scene_id"])
		if scene == null:
			return false
		if type == "SceneState":
			scene._on_state(message)
		else:
			_scenes.erase(message["scene_id"])
			scene._on_end(str(message.get("reason", "ended")))
		for call in _scene_calls:
			if call["scene"] == scene:
				call["done"] = true
		return true
	var talk = _scene_talks.get(message.get("turn_id"))
	if talk != null:
		if type == "SceneTurn":
			talk._on_turn(message)
			return true
		if type == "LLMStreamDelta":
			talk._on_delta(message)
			return true
		if type in ["ToolCall", "Error"]:
			talk._on_event(message)
			return true
	if type == "Error" and message.get("ref") != null:
		var kind: String = str(message["ref"]).split(".")[0]
		for call in _scene_calls:
			if call["kind"] == kind and not call["done"]:
				var refused := MythicError.new(
					MythicError.SERVER,
					message["code"],
					message["message"],
					str(message["ref"]),
					message.get("retryable", false)
				)
				refused.error = message
				call["result"] = refused
				call["done"] = true
				return true
	return false


# Answers a tool call (what the tool handler does for you): `call` is the ToolCall (or any
# Dictionary with its turn_id and call_id). Null when sent, else a MythicError.
func ack(call: Dictionary, status: String, result = null, message := ""):
	var answer := {
		"type": "Ack",
		"ack_of": "ToolCall",
		"status": status,
		"turn_id": call["turn_id"],
		"call_id": call["call_id"]
	}
	if result != null:
		answer["result"] = result
	if message != "":
		answer["message"] = message.left(1000)
	return send(answer)


# Sends a chunk of the player's microphone audio (16-bit little-endian mono PCM) as a binary
# audio frame. Null when sent, else a MythicError.
func send_audio(npc_id: String, pcm: PoolByteArray, sample_rate := 0, turn_id := "", end := false):
	if voice == null:
		return MythicError.new(
			MythicError.USAGE,
			"no_voice",
			"this client's session has no voice: set `voice` before connecting"
		)
	if pcm.size() < 2 or pcm.size() % 2 != 0:
		return MythicError.new(
			MythicError.VALIDATION,
			"invalid_message",
			"pcm is 16-bit samples: an even number of bytes, at least 2",
			"AudioChunk.pcm"
		)
	var header := {
		"type": "AudioChunk",
		"npc_id": npc_id,
		"session_id": session_id,
		"sample_rate": sample_rate if sample_rate > 0 else voice.get("input_rate", 16000),
		"ts_client": OS.get_system_time_msecs() / 1000.0,
		"end": end,
	}
	if turn_id != "":
		header["turn_id"] = turn_id
	header["pcm"] = "AAAA"  # checked as a message; the frame carries the PCM raw
	var checked = _protocol.check_outgoing(header)
	if checked is MythicError:
		return checked
	checked.erase("pcm")
	return _write(_protocol.encode_audio_frame(checked, pcm))


# -- receiving --------------------------------------------------------------------------------


# Coroutine: the next event of no turn (a message, or a MythicError the client reports), or a
# MythicError of kind TIMEOUT after `wait_s` (default timeout_s).
func next_event(wait_s := -1.0):
	var waited = yield(
		Wait.until(self, "_has_events", timeout_s if wait_s < 0 else wait_s, "event"), "completed"
	)
	return waited if waited is MythicError else _events.pop_front()


func _has_events() -> bool:
	return not _events.empty()


func _report(item) -> void:
	_events.append(item)
	while _events.size() > max_events:
		_events.pop_front()
	emit_signal("event", item)


func _forget(turn_id: String) -> void:
	_turns.erase(turn_id)


func _route(message: Dictionary) -> void:
	var type: String = message["type"]
	if type == "ToolCall" and tool_handler != null:
		_answer(message)
	if _route_scene(message):
		return
	var turn = _turns.get(message.get("turn_id"))
	if turn != null and type in ["LLMStreamDelta", "ToolCall", "Cutoff", "Error"]:
		turn._receive(message)
		return
	if type == "IntentUpdate" and _intents.has(message.get("request_id")):
		_intents[message["request_id"]]["result"] = message
		return
	if type == "TTSChunk":
		emit_signal("tts_chunk", message)
	_report(message)


# Runs the tool handler once per call_id: a call the server sends again (its Ack was late or
# lost) is acknowledged `duplicate` with the first answer, and not run again.
func _answer(call: Dictionary):
	var id: String = call["call_id"]
	var status := "duplicate"
	var first = _calls.get(id)
	if first == null:
		first = {"answer": null}
		_calls[id] = first
		_call_order.append(id)
		if _call_order.size() > REMEMBERED_CALLS:
			_calls.erase(_call_order.pop_front())
		var answer = MythicError.new(
			MythicError.USAGE, "no_handler", "the tool handler's object is gone"
		)
		if tool_handler.is_valid():
			var running = tool_handler.call_func(call)
			answer = yield(
				Wait.settle(running, timeout_s, "tool handler of " + call["name"]), "completed"
			)
		first["answer"] = _tool_result(answer)
		status = first["answer"]["status"]
	else:
		var waited = yield(
			Wait.until(self, "_settled_call", timeout_s, "first answer of " + id, [first]),
			"completed"
		)
		if waited is MythicError:
			first = {"answer": {"status": "error", "message": waited.message}}
	var answer: Dictionary = first["answer"]
	var text = answer.get("message")
	var unsent = ack(
		call, status, answer.get("result"), text if typeof(text) == TYPE_STRING else ""
	)
	if unsent != null:
		_report(_connection_lost("the Ack of %s was not sent: %s" % [id, unsent.message]))


func _settled_call(first: Dictionary) -> bool:
	return first["answer"] != null


static func _tool_result(answer) -> Dictionary:
	if answer is MythicError:
		return {"status": "error", "message": answer.message}
	if typeof(answer) != TYPE_DICTIONARY or not answer.get("status") in ["ok", "error", "rejected"]:
		return {
			"status": "error",
			"message": "the tool handler answered %s, not {status: ok|error|rejected}" % str(answer)
		}
	return answer


static func _connection_lost(text: String) -> MythicError:
	return MythicError.new(MythicError.CONNECTION_LOST, "connection_lost", text, "", true)
