# The conformance suite (clients/conformance/scenarios, format in its README) played through the
# addon's public API against a real `mythic serve`, with the audio clips of `talk` steps from a
# folder (MYTHIC_CONFORMANCE_AUDIO). A player is a Node (it polls its bare sockets); `play`
# returns "" when every step held, else which step failed and why.
extends Node

const MythicClient = preload("res://addons/mythic/mythic_client.gd")
const MythicError = preload("res://addons/mythic/mythic_error.gd")
const MythicSocket = preload("res://addons/mythic/mythic_socket.gd")
const Protocol = preload("res://addons/mythic/mythic_protocol.gd")
const Wait = preload("res://addons/mythic/mythic_wait.gd")

# The bound on any one step (a reply on two shared cores included).
const WAIT_S = 120.0

var _url: String
var _name: String
var _audio_dir: String
var _protocol := Protocol.new()
var _clients := {}
var _games := {}
var _sessions := {}
var _bare := {}
var _turns := {}
var _spoken := {}
var _scenes := {}
var _talks := {}


# The game's side of the tool calls: the scenario's answers, and how often each turn's ran.
class Game:
	extends Reference
	var tools := {}
	var runs := {}

	func run(call: Dictionary):
		runs[call["turn_id"]] = runs.get(call["turn_id"], 0) + 1
		var answer: Dictionary = tools.get(call["name"], {"status": "rejected"})
		if answer.get("delay_s", 0) > 0:  # the game takes its time
			yield(Wait.sleep(answer["delay_s"]), "completed")
		return answer


# One turn of a scenario: its MythicTurn, the events read so far, how it ended.
class TurnLog:
	extends Reference
	var turn
	var events := []
	var lost := false
	var over := false

	func _init(of_turn) -> void:
		turn = of_turn

	func read(until: String):
		yield(Engine.get_main_loop(), "idle_frame")
		while not over:
			var event = yield(turn.next_event(), "completed")
			if event == null:
				over = true
			elif event is MythicError:
				if event.kind != MythicError.CONNECTION_LOST:
					return "the turn failed: %s" % event
				lost = true
				over = true
			else:
				events.append(event)
				if until == "text" and event["type"] == "LLMStreamDelta" and event["delta"] != "":
					return ""
		return ""

	func of_type(type: String) -> Array:
		var found := []
		for event in events:
			if event["type"] == type:
				found.append(event)
		return found


# One spoken turn of a scenario: it has no MythicTurn, so its messages are the client's events
# (`event` signal) of its turn_id, in order; over once the reply's text has ended and, if it said
# something, its last audio chunk came (or it was cut off).
class SpokenLog:
	extends Reference
	var events := []
	var replied := false
	var spoken := false

	func receive(message: Dictionary) -> void:
		events.append(message)
		match message["type"]:
			"LLMStreamDelta":
				if message.get("final", false) and message.get("finish_reason") != "tool_call":
					replied = true
					spoken = spoken or message.get("finish_reason") in ["cutoff", "error"]
			"TTSChunk":
				spoken = spoken or message.get("final", false)
			"Cutoff":
				replied = true
				spoken = true

	func is_over() -> bool:
		return replied and (spoken or text().strip_edges() == "")

	func text() -> String:
		var joined := ""
		for delta in of_type("LLMStreamDelta"):
			joined += delta["delta"]
		return joined

	func of_type(type: String) -> Array:
		var found := []
		for event in events:
			if event["type"] == type:
				found.append(event)
		return found

	# The events without their audio, for a failure's message.
	func summary() -> String:
		var lines := PoolStringArray()
		for event in events:
			var line := "%s %s" % [event["type"], str(event.get("seq", ""))]
			if event.has("pcm"):
				line += " (%d bytes, %d visemes)" % [
					Protocol.pcm_of(event).size(), event.get("visemes", []).size()
				]
			for key in ["finish_reason", "final", "text", "code", "reason"]:
				if event.get(key) != null:
					line += " %s=%s" % [key, to_json(event[key])]
			lines.append(line)
		return lines.join("; ").left(2000)


# A plain WebSocket, no client and no SessionStart: the frames it got, in order, and the code
# the server closed it with (-1 while it has not).
class Bare:
	extends Reference
	var socket := MythicSocket.new()
	var frames := []
	var close_code := -1

	func _init() -> void:
		socket.connect("received", self, "_on_received")
		# The addon's socket keeps no close code (a game has no use for it); Godot 3's client
		# signals the server's close frame.
		socket._ws.connect("server_close_request", self, "_on_close_request")

	func _on_received(data: PoolByteArray, _is_text: bool) -> void:
		frames.append(data.get_string_from_utf8())

	func _on_close_request(code: int, _reason: String) -> void:
		close_code = code

	func has_frames() -> bool:
		return not frames.empty()


func _init(url: String, name: String, audio_dir := "") -> void:
	_url = url
	_name = name
	_audio_dir = audio_dir


# The scenarios of a folder, by file name.
static func scenarios(dir_path: String) -> Array:
	var found := []
	var dir := Directory.new()
	if dir.open(dir_path) != OK:
		return found
	var names := []
	dir.list_dir_begin(true, true)
	var name := dir.get_next()
	while name != "":
		if name.ends_with(".json"):
			names.append(name)
		name = dir.get_next()
	names.sort()
	for file_name in names:
		var file := File.new()
		file.open(dir_path.plus_file(file_name), File.READ)
		found.append(parse_json(file.get_as_text()))
		file.close()
	return found


func _process(_delta: float) -> void:
	for bare in _bare.values():
		bare.socket.poll()


# Coroutine: plays the steps in order; "" when all held, else the first failure.
func play(steps: Array):
	var failure := ""
	for n in range(steps.size()):
		var step: Dictionary = steps[n]
		var who: String = step.get("client", "main")
		var run = call("_" + step["do"], step, who)
		var result = yield(
			Wait.settle(run, step.get("timeout_s", WAIT_S), "end of the step"), "completed"
		)
		if result is MythicError:
			result = str(result)
		if result != "":
			failure = "%s step %d %s: %s" % [_name, n, to_json(step).left(300), result]
			break
	for client in _clients.values():
		yield(Wait.settle(client.close(), WAIT_S, "close"), "completed")
		client.queue_free()
	for bare in _bare.values():
		bare.socket.abort()
	return failure


func _fill(value, who: String):
	match typeof(value):
		TYPE_STRING:
			var id: String = _clients[who].session_id if _clients.has(who) else ""
			return value.replace("$session_id", id)
		TYPE_ARRAY:
			var filled := []
			for item in value:
				filled.append(_fill(item, who))
			return filled
		TYPE_DICTIONARY:
			var filled := {}
			for key in value:
				filled[key] = _fill(value[key], who)
			return filled
	return value


# -- steps ------------------------------------------------------------------------------------


func _connect(step: Dictionary, who: String):
	if not _clients.has(who):
		var game := Game.new()
		game.tools = step.get("tools", {})
		var client := MythicClient.new()
		client.url = _url
		client.backoff_s = 0.05
		client.timeout_s = WAIT_S
		client.tool_handler = funcref(game, "run")
		client.voice = step.get("voice")
		client.connect("event", self, "_on_event")
		add_child(client)
		_clients[who] = client
		_games[who] = game
	var welcome = yield(_clients[who].connect_to_server(), "completed")
	if welcome is MythicError:
		return "connect: %s" % welcome
	var expect: Dictionary = step.get("expect", {})
	if expect.has("resumed") and welcome.get("resumed", false) != expect["resumed"]:
		return "Welcome.resumed is %s" % welcome.get("resumed", false)
	if expect.get("same_session", false) and welcome["session_id"] != _sessions.get(who):
		return "a new session %s, not %s" % [welcome["session_id"], _sessions.get(who)]
	_sessions[who] = welcome["session_id"]
	return ""


func _disconnect(_step: Dictionary, who: String):
	var closed = yield(_clients[who].disconnect_from_server(), "completed")
	return "" if closed == null else str(closed)


func _drop(_step: Dictionary, who: String):
	_clients[who].get_socket().abort()  # no close handshake
	return ""


func _wait_resumed(step: Dictionary, who: String):
	var expect: Dictionary = step["expect"]
	var waited = yield(
		Wait.until(self, "_resumed", WAIT_S, "resume", [who, expect["resumes"]]), "completed"
	)
	if waited is MythicError:
		return str(waited)
	var client = _clients[who]
	if client.resumes != expect["resumes"]:
		return "resumed %d times" % client.resumes
	if expect.get("same_session", false) and client.session_id != _sessions[who]:
		return "a new session %s" % client.session_id
	return ""


func _resumed(who: String, resumes: int) -> bool:
	return _clients[who].resumes >= resumes and _clients[who].is_connected_to_server()


func _close(_step: Dictionary, who: String):
	if _bare.has(who):
		_bare[who].socket.close()
		_bare.erase(who)
		return ""
	var client = _clients[who]
	_clients.erase(who)
	var closed = yield(client.close(), "completed")
	client.queue_free()
	return "" if closed == null else str(closed)


func _open_bare(_step: Dictionary, who: String):
	var bare := Bare.new()
	_bare[who] = bare
	if bare.socket.open(_url) != OK:
		return "cannot open %s" % _url
	var opened = yield(Wait.until(bare.socket, "is_open", WAIT_S, "open"), "completed")
	return "" if not opened is MythicError else str(opened)


func _say(step: Dictionary, who: String):
	var turn = _clients[who].say(step["npc"], step["text"], step["turn"])
	_turns[step["turn"]] = TurnLog.new(turn)
	return "" if turn.error == null else "say: %s" % turn.error


func _talk(step: Dictionary, who: String):
	var client = _clients[who]
	if client.voice == null:
		return "the client's session has no voice (connect with `voice`)"
	var path := _audio_dir.plus_file("%s.pcm" % step["audio"])
	var file := File.new()
	if _audio_dir == "" or file.open(path, File.READ) != OK:
		return "cannot read the clip %s (MYTHIC_CONFORMANCE_AUDIO)" % path
	var pcm := file.get_buffer(file.get_len())
	file.close()
	var rate := int(client.voice.get("input_rate", 16000))
	var size := rate * int(step.get("chunk_ms", 40)) / 1000 * 2
	var silence := PoolByteArray()
	for _i in range(size):
		silence.append(0)
	var chunks := []
	for offset in range(0, pcm.size(), size):
		chunks.append(pcm.subarray(offset, min(offset + size, pcm.size()) - 1))
	var silence_size := rate * int(step.get("silence_ms", 800)) / 1000 * 2
	for offset in range(0, silence_size, size):
		chunks.append(silence.subarray(0, min(size, silence_size - offset) - 1))
	_spoken[step["turn"]] = SpokenLog.new()
	for chunk in chunks:
		if chunk.size() < 2:
			continue
		var refused = client.send_audio(step["npc"], chunk, 0, step["turn"])
		if refused != null:
			return "send_audio: %s" % refused
		# Not at real-time pace, but a frame between chunks: the client's socket writes them.
		yield(get_tree(), "idle_frame")
	return ""


func _listen(step: Dictionary, _who: String):
	var turn: String = step["turn"]
	if not _spoken.has(turn):
		return "no talk step spoke turn %s" % turn
	var spoken: SpokenLog = _spoken[turn]
	var waited = yield(
		Wait.until(spoken, "is_over", step.get("timeout_s", WAIT_S), "end of turn " + turn),
		"completed"
	)
	var why: String = str(waited) if waited is MythicError else _check_spoken(
		spoken, step.get("expect", {})
	)
	return "" if why == "" else "%s; events: %s" % [why, spoken.summary()]


# The client's events: the messages of a spoken turn go to its log (the client keeps every
# event for `next_event` too, so `expect_error` still finds its Errors).
func _on_event(item) -> void:
	if typeof(item) == TYPE_DICTIONARY and _spoken.has(item.get("turn_id")):
		_spoken[item["turn_id"]].receive(item)


func _cutoff(step: Dictionary, _who: String):
	var refused = _turns[step["turn"]].turn.cut_off()
	return "" if refused == null else str(refused)


func _scene(step: Dictionary, who: String):
	var refused = _clients[who].scene(
		step["npc"], step.get("zone", ""), step.get("time", ""), step.get("objects")
	)
	return "" if refused == null else str(refused)


func _scene_start(step: Dictionary, who: String):
	var expect: Dictionary = step.get("expect", {})
	var scene = yield(
		_clients[who].start_scene(step["scene"], step["npcs"], int(step.get("max_exchanges", -1))),
		"completed"
	)
	if expect.has("error"):
		if not scene is MythicError or scene.kind != MythicError.SERVER:
			return "the scene was not refused: %s" % str(scene)
		for key in expect["error"]:
			if scene.error.get(key) != expect["error"][key]:
				return "%s %s" % [key, to_json(scene.error)]
		return ""
	if scene is MythicError:
		return str(scene)
	_scenes[step["scene"]] = scene
	if expect.has("npcs") and scene.npcs != expect["npcs"]:
		return "npcs %s" % to_json(scene.npcs)
	return ""


func _scene_say(step: Dictionary, _who: String):
	var scene = _scenes[step["scene"]]
	_talks[step["turn"]] = scene.say(step["text"], step.get("to", ""), step["turn"])
	return ""


func _scene_ambient(step: Dictionary, _who: String):
	var scene = _scenes[step["scene"]]
	_talks[step["turn"]] = scene.ambient(
		int(step.get("lines", 6)),
		step.get("topic", ""),
		step.get("opener", ""),
		step.get("priority", "bronze"),
		step["turn"]
	)
	return ""


func _scene_read(step: Dictionary, _who: String):
	var talk = yield(_talks[step["turn"]].wait(), "completed")
	if talk is MythicError:
		return "the scene line failed: %s" % talk
	var expect: Dictionary = step.get("expect", {})
	var said := []
	for reply in talk.replies:
		said.append([reply["npc_id"], talk.reply_text(reply), reply["finish_reason"]])
		for i in range(reply["deltas"].size()):
			if int(reply["deltas"][i]["seq"]) != i:
				return "seq has gaps: %s" % to_json(said)
	var speakers: Array = talk.speakers()
	if expect.has("speakers") and speakers != expect["speakers"]:
		return "speakers %s" % to_json(said)
	if expect.has("first_speaker") and (speakers.empty() or speakers[0] != expect["first_speaker"]):
		return "first speaker %s" % to_json(said)
	if expect.has("at_most") and talk.replies.size() > int(expect["at_most"]):
		return "more than %d replies: %s" % [int(expect["at_most"]), to_json(said)]
	if expect.has("chosen_by") and (talk.turns.empty() or talk.turns[0]["chosen_by"] != expect["chosen_by"]):
		return "chosen_by %s" % to_json(talk.turns)
	if expect.get("text", false) and (said.empty() or said[0][1].strip_edges() == ""):
		return "no text: %s" % to_json(said)
	if expect.has("finish_reason"):
		for reply in said:
			if not reply[2] in expect["finish_reason"]:
				return "finish_reason %s" % to_json(said)
	if expect.has("errors"):
		var codes := []
		for error in talk.errors:
			codes.append(error["code"])
		if codes != expect["errors"]:
			return "errors %s" % to_json(codes)
	return ""


func _scene_join(step: Dictionary, _who: String):
	var npcs = yield(_scenes[step["scene"]].join(step["npc"]), "completed")
	return _scene_members(step, npcs)


func _scene_leave(step: Dictionary, _who: String):
	var npcs = yield(_scenes[step["scene"]].leave(step["npc"]), "completed")
	return _scene_members(step, npcs)


func _scene_members(step: Dictionary, npcs):
	if npcs is MythicError:
		return str(npcs)
	if step.get("expect", {}).has("npcs") and npcs != step["expect"]["npcs"]:
		return "npcs %s" % to_json(npcs)
	return ""


func _scene_end(step: Dictionary, _who: String):
	var scene = _scenes[step["scene"]]
	var failed = yield(scene.end(), "completed")
	if failed != null:
		return str(failed)
	return "" if scene.ended != "" else "the scene did not end"


func _intent(step: Dictionary, who: String):
	var update = yield(
		_clients[who].intent(
			step["npc"],
			step.get("context", ""),
			step.get("with_bark", false),
			step.get("request_id", "")
		),
		"completed"
	)
	if update is MythicError:
		return str(update)
	var expect: Dictionary = step.get("expect", {})
	if update["npc_id"] != step["npc"]:
		return "an intent of %s" % update["npc_id"]
	if expect.has("request_id") and update.get("request_id") != expect["request_id"]:
		return "request_id %s" % update.get("request_id")
	if expect.get("bark", false):
		var bark = update.get("bark")
		var words := 0 if bark == null else Array(bark.split(" ", false)).size()
		if words < 1 or words > 8:
			return "bark %s" % to_json(bark)
	if expect.has("target_in") and not update.get("target") in expect["target_in"]:
		return "target %s" % to_json(update.get("target"))
	return ""


func _ack(step: Dictionary, who: String):
	var call := {"turn_id": step["turn"], "call_id": step.get("call_id", "")}
	if step.has("call"):
		var calls: Array = _turns[step["turn"]].of_type("ToolCall")
		if calls.size() <= step["call"]:
			return "the turn has no ToolCall %d" % step["call"]
		call = calls[step["call"]]
	var refused = _clients[who].ack(call, step["status"])
	return "" if refused == null else str(refused)


func _send(step: Dictionary, who: String):
	var refused = _clients[who].send(_fill(step["message"], who))
	if step.get("refused_locally", false):
		if not refused is MythicError or refused.kind != MythicError.VALIDATION:
			return "not refused by the client: %s" % str(refused)
		return ""
	return "" if refused == null else str(refused)


func _send_raw(step: Dictionary, who: String):
	var frame
	if step.has("text"):
		var text: String = _fill(step["text"], who)
		var repeated := PoolStringArray()
		repeated.resize(int(step.get("repeat", 1)))
		for i in range(repeated.size()):
			repeated[i] = text
		frame = repeated.join("")
	elif step.has("binary_base64"):
		frame = Marshalls.base64_to_raw(step["binary_base64"])
	else:
		var audio: Dictionary = step["audio_frame"]
		frame = _protocol.encode_audio_frame(
			_fill(audio["header"], who), Marshalls.base64_to_raw(audio["pcm_base64"])
		)
	# `count` frames in one go, no frame of the game loop between them: a flood outruns the
	# server's refill only when the frames come faster than it (50 a second by default).
	for _i in range(int(step.get("count", 1))):
		if _bare.has(who):
			var socket = _bare[who].socket
			var sent: int = (
				socket.send_text(frame)
				if typeof(frame) == TYPE_STRING
				else socket.send_binary(frame)
			)
			if sent != OK:
				return "not sent: error %d" % sent
		else:
			var refused = _clients[who].send_raw(frame)
			if refused != null:
				return str(refused)
	return ""


func _expect_error(step: Dictionary, who: String):
	var error = null
	while error == null:
		var event
		if _bare.has(who):
			var bare: Bare = _bare[who]
			var waited = yield(Wait.until(bare, "has_frames", WAIT_S, "frame"), "completed")
			if waited is MythicError:
				return str(waited)
			event = _protocol.parse_server_frame(bare.frames.pop_front())
		else:
			event = yield(_clients[who].next_event(WAIT_S), "completed")
			if event is MythicError and event.kind == MythicError.TIMEOUT:
				return str(event)
		if typeof(event) == TYPE_DICTIONARY and event["type"] == "Error":
			error = event
	for key in step["expect"]:
		if not _same(error.get(key), step["expect"][key]):
			return "%s of %s" % [key, to_json(error)]
	return ""


func _expect_closed(step: Dictionary, who: String):
	if not _bare.has(who):
		return "expect_closed is for a bare connection (open_bare)"
	var bare: Bare = _bare[who]
	var waited = yield(Wait.until(bare.socket, "is_done", WAIT_S, "close"), "completed")
	if waited is MythicError:
		return str(waited)
	bare.frames.clear()  # what came before the close is skipped
	var code := int(step["expect"]["code"])
	return "" if bare.close_code == code else "closed with code %d" % bare.close_code


func _read(step: Dictionary, who: String):
	var turn_log: TurnLog = _turns[step["turn"]]
	var failed = yield(turn_log.read(step["until"]), "completed")
	if failed != "":
		return failed
	if step["until"] != "end":
		return ""
	var why := _check_turn(turn_log, step.get("expect", {}), _games[who].runs.get(step["turn"], 0))
	return "" if why == "" else "%s; events: %s" % [why, to_json(turn_log.events).left(2000)]


func _check_spoken(spoken: SpokenLog, expect: Dictionary) -> String:
	var deltas := spoken.of_type("LLMStreamDelta")
	for i in range(deltas.size()):
		if deltas[i]["seq"] != i:
			return "seq has gaps"
	if expect.has("finish_reason"):
		var reason = null if deltas.empty() else deltas[-1].get("finish_reason")
		if not reason in expect["finish_reason"]:
			return "finish_reason %s" % to_json(reason)
	if expect.get("text", false) and spoken.text().strip_edges() == "":
		return "no text"
	var heard := spoken.of_type("ASRFinal")
	if expect.get("heard", false) and (heard.empty() or heard[-1]["text"].strip_edges() == ""):
		return "nothing heard"
	if expect.get("audio", false):
		return _check_audio(spoken.of_type("TTSChunk"))
	return ""


# The TTSChunks of a turn: seq without gaps, only the last final, PCM in each, and visemes
# whose times run forward within each chunk and, placed at the chunk's start, through the turn.
static func _check_audio(chunks: Array) -> String:
	if chunks.empty():
		return "no TTSChunk"
	var start := 0.0  # where the chunk begins in the turn, in seconds
	var last_time := -1.0  # the last viseme's time in the turn
	for i in range(chunks.size()):
		var chunk: Dictionary = chunks[i]
		if chunk["seq"] != i:
			return "TTSChunk seq has gaps"
		if chunk.get("final", false) != (i == chunks.size() - 1):
			return "TTSChunk %d's final is %s" % [i, chunk.get("final", false)]
		var pcm := Protocol.pcm_of(chunk)
		if pcm.empty() or pcm.size() % 2 != 0 or chunk["sample_rate"] <= 0:
			return "TTSChunk %d: %d bytes at %s Hz" % [i, pcm.size(), chunk["sample_rate"]]
		var duration: float = pcm.size() / 2.0 / chunk["sample_rate"]
		var times := []
		for viseme in chunk.get("visemes", []):
			times.append(viseme["t"])
		for j in range(times.size()):
			if (j > 0 and times[j] <= times[j - 1]) or times[j] < 0 or times[j] > duration:
				return (
					"TTSChunk %d's viseme times %s do not run forward within 0 to %s s"
					% [i, to_json(times), duration]
				)
			if start + times[j] < last_time:
				return "TTSChunk %d's visemes run backward in the turn" % i
			last_time = start + times[j]
		start += duration
	return "" if last_time >= 0 else "no visemes"


# Equal values of one JSON type (GDScript refuses to compare a String with a number).
static func _same(a, b) -> bool:
	return to_json(a) == to_json(b)


func _check_turn(turn_log: TurnLog, expect: Dictionary, tool_runs: int) -> String:
	var deltas := turn_log.of_type("LLMStreamDelta")
	for i in range(deltas.size()):
		if deltas[i]["seq"] != i:
			return "seq has gaps"
	if turn_log.lost != expect.get("lost", false):
		return "lost is %s" % turn_log.lost
	if expect.has("finish_reason") and not turn_log.turn.finish_reason in expect["finish_reason"]:
		return "finish_reason %s" % turn_log.turn.finish_reason
	if expect.get("text", false) and turn_log.turn.text().strip_edges() == "":
		return "no text"
	var calls := turn_log.of_type("ToolCall")
	if expect.has("tool_calls"):
		if calls.size() != expect["tool_calls"].size():
			return "%d tool calls" % calls.size()
		for i in range(calls.size()):
			var wanted: Dictionary = expect["tool_calls"][i]
			if calls[i]["name"] != wanted["name"]:
				return "tool call %d is %s" % [i, calls[i]["name"]]
			var args: Dictionary = wanted.get("args", {})
			for key in args:
				if not _same(calls[i]["args"].get(key), args[key]):
					return "tool call %d's %s" % [i, key]
	if expect.has("distinct_calls"):
		var ids := {}
		for call in calls:
			ids[call["call_id"]] = true
		if ids.size() != expect["distinct_calls"]:
			return "%d distinct calls" % ids.size()
	if expect.has("tool_runs") and tool_runs != expect["tool_runs"]:
		return "the tool handler ran %d times" % tool_runs
	if expect.get("voiced", false):
		var after := ""
		var seen_end := false
		for d in deltas:
			if seen_end:
				after += d["delta"]
			seen_end = seen_end or d.get("finish_reason") == "tool_call"
		if not seen_end or after.strip_edges() == "":
			return "the tool's result was not voiced"
	if expect.has("cutoffs"):
		var reasons := []
		for cutoff in turn_log.of_type("Cutoff"):
			reasons.append(cutoff.get("reason"))
		if reasons != expect["cutoffs"]:
			return "cutoffs %s" % to_json(reasons)
	if expect.has("errors"):
		var codes := []
		for error in turn_log.of_type("Error"):
			codes.append(error["code"])
		if codes != expect["errors"]:
			return "errors %s" % to_json(codes)
	return ""
