# The client against a scripted peer (test/scripted_peer.gd, the other side of the boundary):
# what a real server never sends (a newer schema_version, an unknown type, a ToolCall sent
# again while the game still acts), voice frames both ways, a connection lost mid-turn (the
# conformance suite drops it from the client's side), and waits that must end. The real
# server's behaviour is the conformance suite's. Each test_ method is a coroutine that returns
# "" when every check held, else what failed.
extends Node

const MythicClient = preload("res://addons/mythic/mythic_client.gd")
const MythicError = preload("res://addons/mythic/mythic_error.gd")
const Protocol = preload("res://addons/mythic/mythic_protocol.gd")
const ScriptedPeer = preload("scripted_peer.gd")
const Wait = preload("res://addons/mythic/mythic_wait.gd")

const RECORDED = "res://test/data/tts_chunks.json"

var _peer: ScriptedPeer
var _client: MythicClient
var _protocol := Protocol.new()
var _failures := []
var _runs := []
var _tts := []
var _lines := 0


func test_a_newer_schema_version_or_an_unknown_type_is_a_typed_event_and_the_turn_goes_on():
	var failed = yield(_start("_send_unreadable_frames"), "completed")
	if failed != "":
		return failed
	var reported := []
	_client.connect("event", self, "_on_event", [reported])
	var turn = _client.say("marla", "Open?", "t-1")
	var reply = yield(turn.reply(), "completed")
	_expect(reply is String and reply == "Aye, we're open.", "reply %s" % str(reply))
	_expect(turn.finish_reason == "stop", "finish_reason %s" % turn.finish_reason)
	var codes := []
	for _i in range(5):
		var event = yield(_client.next_event(), "completed")
		_expect(event is MythicError and event.kind == MythicError.PROTOCOL, str(event))
		codes.append(event.code if event is MythicError else str(event))
	var expected := [
		"bad_schema_version", "unknown_type", "bad_json", "invalid_message", "bad_audio_frame"
	]
	_expect(codes == expected, "codes %s" % to_json(codes))
	_expect(reported.size() == 5, "%d events signalled" % reported.size())
	return yield(_finish(), "completed")


func _send_unreadable_frames(peer: ScriptedPeer, id: int, message: Dictionary) -> void:
	if message.get("type") != "PlayerUtterance":
		return
	peer.send(id, _delta(0, "Aye, "))
	peer.send(id, _with(_delta(1, "x"), "schema_version", "v2"))
	peer.send(id, {"schema_version": "v1", "type": "Teleport"})
	peer.send_text(id, "not json")
	peer.send(id, _with(_delta(1, "x"), "seq", -1))
	peer.send_binary(id, "MYA1".to_ascii() + PoolByteArray([9, 0, 0, 0]))
	peer.send(id, _delta(1, "we're open.", true))


func test_a_tool_call_sent_again_runs_the_handler_once_and_is_acknowledged_duplicate():
	var failed = yield(_start("_call_twice"), "completed")
	if failed != "":
		return failed
	_client.tool_handler = funcref(self, "_give_item")
	var turn = _client.say("marla", "Ale, please.", "t-1")
	var reply = yield(turn.reply(), "completed")
	_expect(reply is String and reply == "Here.", "reply %s" % str(reply))
	_expect(_runs == ["give_item"], "the handler ran for %s" % to_json(_runs))
	var acks := []
	for ack in _peer.of_type("Ack"):
		acks.append([ack["status"], ack["call_id"], ack.get("result")])
	var expected := [["ok", "c-1", {"given": 1}], ["duplicate", "c-1", {"given": 1}]]
	_expect(to_json(acks) == to_json(expected), "acks %s" % to_json(acks))
	_expect(turn.tool_calls.size() == 2, "%d tool calls" % turn.tool_calls.size())
	return yield(_finish(), "completed")


func _call_twice(peer: ScriptedPeer, id: int, message: Dictionary) -> void:
	if message.get("type") == "PlayerUtterance":
		var call := {
			"schema_version": "v1",
			"type": "ToolCall",
			"name": "give_item",
			"args": {"item": "ale"},
			"npc_id": "marla",
			"turn_id": "t-1",
			"call_id": "c-1",
		}
		peer.send(id, call)
		peer.send(id, call)
	if message.get("type") == "Ack" and peer.of_type("Ack").size() == 2:
		peer.send(id, _delta(0, "Here.", true))


# The game takes its time: the call is sent again while the first run still goes on.
func _give_item(call: Dictionary):
	_runs.append(call["name"])
	yield(Wait.sleep(0.2), "completed")
	return {"status": "ok", "result": {"given": 1}}


func test_every_wait_is_bounded():
	var failed = yield(_start("", 0.3), "completed")
	if failed != "":
		return failed
	var intent = yield(_client.intent("marla", "", false, "i-1"), "completed")
	_expect(
		intent is MythicError and intent.kind == MythicError.TIMEOUT, "intent: %s" % str(intent)
	)
	var turn = _client.say("marla", "Hello?")
	var reply = yield(turn.reply(), "completed")
	_expect(reply is MythicError and reply.kind == MythicError.TIMEOUT, "reply: %s" % str(reply))
	_expect(turn.over and turn.error == reply, "the silent turn is over")
	var event = yield(_client.next_event(0.05), "completed")
	_expect(event is MythicError and event.kind == MythicError.TIMEOUT, "event: %s" % str(event))
	yield(_finish(), "completed")
	failed = yield(_start("", 0.3, false), "completed")
	_expect(failed.begins_with("connect: timeout"), "a peer that never welcomes: %s" % failed)
	return yield(_finish(), "completed")


func test_a_server_error_on_session_start_is_returned_by_connect():
	var failed = yield(_start("_refuse_session", 2.0, false), "completed")
	_expect(failed.begins_with("connect: server too_many_sessions"), failed)
	var refused = _client.get_meta("refused")
	_expect(refused.retryable and refused.error["message"] == "full", str(refused))
	return yield(_finish(), "completed")


func _refuse_session(peer: ScriptedPeer, id: int, _message: Dictionary) -> void:
	var error := {
		"schema_version": "v1",
		"type": "Error",
		"code": "too_many_sessions",
		"message": "full",
		"retryable": true,
	}
	peer.send(id, error)


func test_what_breaks_the_schema_is_refused_before_sending():
	var failed = yield(_start(""), "completed")
	if failed != "":
		return failed
	var blank = _client.say("marla", "   ")
	_expect(blank.over and blank.error is MythicError, "a blank line was said")
	if blank.error is MythicError:
		_expect(blank.error.kind == MythicError.VALIDATION, blank.error.kind)
		_expect(blank.error.ref == "PlayerUtterance.text", blank.error.ref)
	var far = _client.scene("marla", "", "", {"player": -1})
	_expect(far is MythicError and far.ref == "SceneUpdate.objects.0.dist", str(far))
	var nobody = _client.say("not an id!", "Hi")
	_expect(nobody.error is MythicError and nobody.error.ref == "PlayerUtterance.npc_id", "npc_id")
	var silent = _client.send_audio("marla", PoolByteArray([0, 0]))
	_expect(silent is MythicError and silent.code == "no_voice", str(silent))
	# A valid message after them: once it is in, whatever had been sent before is in too.
	_expect(_client.scene("marla", "old_town") == null, "a valid SceneUpdate was refused")
	yield(Wait.until(self, "_peer_has", 5.0, "SceneUpdate", ["SceneUpdate"]), "completed")
	var types := []
	for message in _peer.received:
		types.append(message.get("type"))
	_expect(types == ["SessionStart", "SceneUpdate"], "the peer received %s" % to_json(types))
	return yield(_finish(), "completed")


func test_voice_frames_both_ways_carry_the_pcm_and_the_visemes():
	var failed = yield(
		_start("_speak", 5.0, true, {"input_rate": 16000, "binary": true}), "completed"
	)
	if failed != "":
		return failed
	_client.connect("tts_chunk", self, "_on_tts_chunk")
	var turn = _client.say("marla", "Speak.", "t-1")
	var reply = yield(turn.reply(), "completed")
	_expect(reply is String and reply == "Mind the marsh, friend.", "reply %s" % str(reply))
	var recorded := _recorded_chunks()
	_expect(_tts.size() == 2, "%d TTSChunks came" % _tts.size())
	for i in range(min(_tts.size(), 2)):
		_expect(Protocol.pcm_of(_tts[i]) == Protocol.pcm_of(recorded[i]), "chunk %d's pcm" % i)
		_expect(to_json(_tts[i]["visemes"]) == to_json(recorded[i]["visemes"]), "visemes %d" % i)
	_expect(_peer.of_type("SessionStart")[0].get("voice", {}).get("binary") == true, "voice")
	var pcm := PoolByteArray([1, 0, 255, 127, 0, 128])
	var sent = _client.send_audio("marla", pcm, 0, "t-2", true)
	_expect(sent == null, "send_audio: %s" % str(sent))
	yield(Wait.until(self, "_peer_has_binary", 5.0, "audio frame"), "completed")
	var frames := []
	for message in _peer.received:
		if message.has("binary"):
			frames.append(message["binary"])
	_expect(frames.size() == 1, "%d binary frames" % frames.size())
	if frames.size() == 1:
		var frame: PoolByteArray = frames[0]
		var size: int = frame[4] | (frame[5] << 8) | (frame[6] << 16) | (frame[7] << 24)
		var header = parse_json(frame.subarray(8, 7 + size).get_string_from_utf8())
		_expect(frame.subarray(0, 3).get_string_from_ascii() == "MYA1", "magic")
		_expect(header["type"] == "AudioChunk" and header["sample_rate"] == 16000, to_json(header))
		_expect(header["end"] == true and header["turn_id"] == "t-2", to_json(header))
		_expect(not header.has("pcm"), "pcm in the header")
		_expect(frame.subarray(8 + size, frame.size() - 1) == pcm, "the pcm")
	return yield(_finish(), "completed")


func _speak(peer: ScriptedPeer, id: int, message: Dictionary) -> void:
	if message.get("type") != "PlayerUtterance":
		return
	for chunk in _recorded_chunks().slice(0, 1):
		var header: Dictionary = chunk.duplicate()
		header.erase("pcm")
		peer.send_binary(id, _protocol.encode_audio_frame(header, Protocol.pcm_of(chunk)))
	peer.send(id, _delta(0, "Mind the marsh, friend.", true))


func _peer_has_binary() -> bool:
	for message in _peer.received:
		if message.has("binary"):
			return true
	return false


func _peer_has(type: String) -> bool:
	return not _peer.of_type(type).empty()


func _on_tts_chunk(chunk: Dictionary) -> void:
	_tts.append(chunk)


func test_a_connection_lost_mid_turn_ends_the_turn_and_the_session_resumes():
	var failed = yield(_start("_drop_first_line"), "completed")
	if failed != "":
		return failed
	var lost = _client.say("marla", "Tell me all.", "t-1")
	var reply = yield(lost.reply(), "completed")
	_expect(reply is MythicError and reply.kind == MythicError.CONNECTION_LOST, str(reply))
	_expect(lost.over and lost.text() == "Well, ", "text %s" % to_json(lost.text()))
	var resumed = yield(Wait.until(self, "_resumed", 5.0, "resume"), "completed")
	_expect(not resumed is MythicError, "resumes %d: %s" % [_client.resumes, str(resumed)])
	var starts := _peer.of_type("SessionStart")
	_expect(starts.size() == 2, "%d SessionStarts" % starts.size())
	if starts.size() == 2:
		_expect(starts[1].get("resume_token") == "r-1", to_json(starts[1]))
		_expect(starts[1].get("session_id") == "s-1", to_json(starts[1]))
	var turn = _client.say("marla", "Thanks.", "t-2")
	reply = yield(turn.reply(), "completed")
	_expect(reply is String and reply == "Farewell.", "after the resume: %s" % str(reply))
	return yield(_finish(), "completed")


func _drop_first_line(peer: ScriptedPeer, id: int, message: Dictionary) -> void:
	if message.get("type") != "PlayerUtterance":
		return
	_lines += 1
	if _lines == 1:
		peer.send(id, _with(_delta(0, "Well, "), "turn_id", "t-1"))
		peer.call_deferred("restart")  # after the delta has gone out
	else:
		peer.send(id, _with(_delta(0, "Farewell.", true), "turn_id", "t-2"))


func _resumed() -> bool:
	return _client.resumes == 1 and _client.is_connected_to_server()


# -- harness ----------------------------------------------------------------------------------


# Coroutine: a peer following the script method `step` ("" for none) and a connected client;
# "" when connected, else why not (the client stays, for the test to look at).
func _start(step: String, timeout_s := 5.0, welcome := true, voice = null):
	_failures.clear()
	_runs.clear()
	_tts.clear()
	_lines = 0
	_peer = ScriptedPeer.new()
	_peer.welcome = welcome
	if step != "":
		_peer.script_step = funcref(self, step)
	add_child(_peer)
	if _peer.start() != OK:
		yield(Engine.get_main_loop(), "idle_frame")
		return "the peer cannot listen"
	_client = MythicClient.new()
	_client.url = _peer.url()
	_client.timeout_s = timeout_s
	_client.backoff_s = 0.05
	_client.voice = voice
	add_child(_client)
	var welcome_message = yield(_client.connect_to_server(), "completed")
	if welcome_message is MythicError:
		_client.set_meta("refused", welcome_message)
		return "connect: %s" % welcome_message
	return ""


# Coroutine: closes the client and the peer; the failures of the test, or "".
func _finish():
	yield(_client.close(), "completed")
	_client.queue_free()
	_peer.stop()
	_peer.queue_free()
	var failures := PoolStringArray(_failures.slice(0, 4) if _failures.size() > 5 else _failures)
	_failures.clear()
	return failures.join("; ")


func _expect(holds: bool, what: String) -> void:
	if not holds:
		_failures.append(what)


func _on_event(item, reported: Array) -> void:
	reported.append(item)


func _recorded_chunks() -> Array:
	var file := File.new()
	file.open(RECORDED, File.READ)
	var chunks: Array = parse_json(file.get_as_text())["chunks"]
	file.close()
	return chunks


static func _delta(seq: int, text: String, final := false) -> Dictionary:
	var message := {
		"schema_version": "v1",
		"type": "LLMStreamDelta",
		"npc_id": "marla",
		"session_id": "s-1",
		"turn_id": "t-1",
		"seq": seq,
		"delta": text,
	}
	if final:
		message["final"] = true
		message["finish_reason"] = "stop"
	return message


static func _with(message: Dictionary, key: String, value) -> Dictionary:
	var copy := message.duplicate(true)
	copy[key] = value
	return copy
