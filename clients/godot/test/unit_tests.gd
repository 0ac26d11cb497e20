# Unit tests of the addon without a server: validation against the generated definitions,
# reading server frames, the binary audio framing, turn text, and lip-sync driven by a recorded
# TTS line of the server's voice (test/data/tts_chunks.json, tools/record_tts_chunks.py), the
# lip-sync example of docs/engines/godot.md included.
# Each test_ method returns "" when every check held, else what failed.
extends Reference

const Messages = preload("res://addons/mythic/generated/messages.gd")
const MythicError = preload("res://addons/mythic/mythic_error.gd")
const MythicLipSync = preload("res://addons/mythic/mythic_lip_sync.gd")
const MythicTurn = preload("res://addons/mythic/mythic_turn.gd")
const Protocol = preload("res://addons/mythic/mythic_protocol.gd")
const TalkingFace = preload("res://examples/talking_face.gd")

const RECORDED = "res://test/data/tts_chunks.json"
const ID = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.:-"

var _protocol := Protocol.new()
var _failures := []


# A client of no server: what a turn asks of its client.
class NoClient:
	extends Reference
	var timeout_s := 1.0
	var session_id := "s-1"

	func _forget(_turn_id: String) -> void:
		pass


func test_a_valid_message_is_sent_with_its_schema_version() -> String:
	var line := {
		"type": "PlayerUtterance",
		"npc_id": "marla",
		"session_id": "s-1",
		"turn_id": "t-1",
		"text": "Hello"
	}
	var checked = _protocol.check_outgoing(line)
	_expect(typeof(checked) == TYPE_DICTIONARY, "refused: %s" % str(checked))
	if typeof(checked) == TYPE_DICTIONARY:
		_expect(
			checked["schema_version"] == "v1", "schema_version %s" % checked.get("schema_version")
		)
		_expect(not line.has("schema_version"), "the caller's message was changed")
	return _result()


func test_what_breaks_the_schema_is_refused_with_the_field() -> String:
	var line := {
		"type": "PlayerUtterance", "npc_id": "marla", "session_id": "s-1", "turn_id": "t-1"
	}
	var cases := [
		[_with(line, "text", ""), "PlayerUtterance.text"],
		[_with(line, "text", "   "), "PlayerUtterance.text"],
		[_with(line, "text", "x".repeat(4001)), "PlayerUtterance.text"],
		[line, "PlayerUtterance.text"],
		[_with(line, "text", 7), "PlayerUtterance.text"],
		[_with(_with(line, "text", "Hi"), "mood", "grim"), "PlayerUtterance.mood"],
		[_with(_with(line, "text", "Hi"), "npc_id", "not an id!"), "PlayerUtterance.npc_id"],
		[_with(_with(line, "text", "Hi"), "npc_id", "marla\n"), "PlayerUtterance.npc_id"],
		[
			_with(_with(line, "text", "Hi"), "schema_version", "v2"),
			"PlayerUtterance.schema_version"
		],
		[{"type": "SceneUpdate", "npc_id": "marla", "time": "25:00"}, "SceneUpdate.time"],
		[
			{"type": "SceneUpdate", "npc_id": "marla", "objects": [{"id": "player", "dist": -1}]},
			"SceneUpdate.objects.0.dist"
		],
		[
			{"type": "SceneUpdate", "npc_id": "marla", "objects": [{"id": "player"}]},
			"SceneUpdate.objects.0.dist"
		],
		[
			{
				"type": "Cutoff",
				"npc_id": "marla",
				"session_id": "s-1",
				"turn_id": "t-1",
				"reason": "bored"
			},
			"Cutoff.reason"
		],
		[{"type": "Ack", "ack_of": "ToolCall", "status": "fine"}, "Ack.status"],
		[{"type": "Ack", "ack_of": "ToolCall", "status": "ok", "result": [1]}, "Ack.result"],
		[
			{
				"type": "AudioChunk",
				"npc_id": "m",
				"session_id": "s",
				"pcm": "AAAA",
				"sample_rate": 16000.5,
				"ts_client": 0
			},
			"AudioChunk.sample_rate"
		],
		[
			{
				"type": "AudioChunk",
				"npc_id": "m",
				"session_id": "s",
				"pcm": "AAAA",
				"sample_rate": 4000,
				"ts_client": 0
			},
			"AudioChunk.sample_rate"
		],
		[
			{"type": "Welcome", "session_id": "s-1", "resume_token": "r", "max_frame_bytes": 5},
			"type"
		],
		[{"type": "Teleport"}, "type"],
		[{"npc_id": "marla"}, "type"],
	]
	for case in cases:
		var refused = _protocol.check_outgoing(case[0])
		if not refused is MythicError:
			_failures.append("not refused: %s" % to_json(case[0]).left(120))
			continue
		_expect(refused.kind == MythicError.VALIDATION, "kind %s" % refused.kind)
		_expect(
			refused.ref == case[1], "ref %s, not %s (%s)" % [refused.ref, case[1], refused.message]
		)
	var welcome = _protocol.check_outgoing({"type": "Welcome"})
	_expect(welcome is MythicError and "not sent by a client" in welcome.message, str(welcome))
	return _result()


func test_optional_fields_take_null_and_scene_objects_are_checked_each() -> String:
	var ok := [
		{"type": "SessionStart"},
		{"type": "SessionStart", "player_id": null, "voice": {"input_rate": 16000, "binary": true}},
		{
			"type": "SceneUpdate",
			"npc_id": "grisk",
			"zone": "the_catacombs",
			"time": "23:40",
			"objects": [{"id": "player", "dist": 2}, {"id": "ghoul_2", "dist": 4.5}]
		},
		{
			"type": "IntentRequest",
			"npc_id": "grisk",
			"request_id": "i-1",
			"context": null,
			"with_bark": true
		},
		{
			"type": "Ack",
			"ack_of": "ToolCall",
			"status": "ok",
			"turn_id": "t-1",
			"call_id": "c-1",
			"result": {"distance_m": 140}
		},
	]
	for message in ok:
		var checked = _protocol.check_outgoing(message)
		_expect(not checked is MythicError, "%s refused: %s" % [message["type"], str(checked)])
	return _result()


func test_cross_field_rules_refuse_with_the_field_and_accept_what_meets_them() -> String:
	# The schema's if/then rules (generated RULES) and the VoiceFormat.input_rate enum: what
	# the server's validators refuse is refused here, with the field; what they take is sent.
	var ack := {"type": "Ack", "ack_of": "ToolCall", "status": "ok", "turn_id": "t-1"}
	var refused := [
		[ack, "Ack.call_id", "is required when ack_of is \"ToolCall\""],
		[_with(ack, "call_id", null), "Ack.call_id", "when ack_of is \"ToolCall\""],
		[
			{"type": "SessionStart", "session_id": "s-1"},
			"SessionStart.resume_token",
			"is required when session_id is a string"
		],
		[
			{"type": "SessionStart", "resume_token": "r-1"},
			"SessionStart.session_id",
			"is required when resume_token is a string"
		],
		[
			{"type": "SessionStart", "session_id": "s-1", "resume_token": null},
			"SessionStart.resume_token",
			"when session_id is a string"
		],
		[
			{"type": "SessionStart", "voice": {"input_rate": 22050}},
			"SessionStart.voice.input_rate",
			"must be one of [16000,32000,48000]"
		],
		[
			{"type": "SessionStart", "voice": {"input_rate": 22050.0}},
			"SessionStart.voice.input_rate",
			"must be one of"
		],
	]
	for case in refused:
		var checked = _protocol.check_outgoing(case[0])
		if not checked is MythicError:
			_failures.append("not refused: %s" % to_json(case[0]))
			continue
		_expect(checked.kind == MythicError.VALIDATION, "kind %s" % checked.kind)
		_expect(checked.ref == case[1], "ref %s, not %s" % [checked.ref, case[1]])
		_expect(case[2] in checked.message, "%s: %s" % [to_json(case[0]), checked.message])
	var accepted := [
		_with(ack, "call_id", "c-1"),
		{"type": "Ack", "ack_of": "SceneUpdate", "status": "ok"},
		{"type": "Ack", "ack_of": "SceneUpdate", "status": "ok", "call_id": null},
		{"type": "SessionStart", "session_id": "s-1", "resume_token": "r-1"},
		{"type": "SessionStart", "session_id": null, "resume_token": null},
		{"type": "SessionStart"},
		{"type": "SessionStart", "voice": {"input_rate": 32000}},
		{"type": "SessionStart", "voice": {"input_rate": 48000.0, "binary": true}},
	]
	for message in accepted:
		var checked = _protocol.check_outgoing(message)
		_expect(not checked is MythicError, "%s refused: %s" % [to_json(message), str(checked)])
	return _result()


func test_a_final_delta_and_only_it_has_a_finish_reason() -> String:
	# LLMStreamDelta's rule, which the server keeps: a frame that breaks it is not read.
	var delta := {
		"schema_version": "v1",
		"type": "LLMStreamDelta",
		"npc_id": "marla",
		"session_id": "s-1",
		"turn_id": "t-1",
		"seq": 0,
		"delta": "Aye."
	}
	var broken := [
		[_with(delta, "final", true), "is required when final is true"],
		[_with(_with(delta, "final", true), "finish_reason", null), "when final is true"],
		[_with(delta, "finish_reason", "stop"), "is not null unless final is true"],
		[
			_with(_with(delta, "final", false), "finish_reason", "stop"),
			"is not null unless final is true"
		],
	]
	for case in broken:
		var read = _protocol.parse_server_frame(to_json(case[0]))
		if not read is MythicError:
			_failures.append("read: %s" % to_json(case[0]))
			continue
		_expect(read.code == "invalid_message", "%s: %s" % [to_json(case[0]), str(read)])
		_expect(read.ref == "LLMStreamDelta.finish_reason", "ref %s" % read.ref)
		_expect(case[1] in read.message, "%s: %s" % [to_json(case[0]), read.message])
	var fine := [
		delta,
		_with(delta, "final", false),
		_with(delta, "finish_reason", null),
		_with(_with(delta, "final", true), "finish_reason", "stop"),
		_with(_with(delta, "final", true), "finish_reason", "tool_call"),
	]
	for message in fine:
		var read = _protocol.parse_server_frame(to_json(message))
		_expect(not read is MythicError, "%s not read: %s" % [to_json(message), str(read)])
	return _result()


func test_the_generated_definitions_cover_every_message_type() -> String:
	for type in Messages.CLIENT_TYPES + Messages.SERVER_TYPES:
		_expect(Messages.DEFS.has(type), "no definition of %s" % type)
		if Messages.DEFS.has(type):
			_expect("type" in Messages.DEFS[type]["required"], "%s without a required type" % type)
	_expect(
		(
			Messages.ENUMS["LLMStreamDelta.finish_reason"]
			== ["stop", "length", "tool_call", "cutoff", "error"]
		),
		"finish reasons"
	)
	return _result()


func test_character_runs_match_as_regex_does() -> String:
	# The generator turns ^[..]{m,n}$ patterns into runs checked without RegEx: both agree.
	var patterns := {}
	for name in Messages.DEFS:
		for rules in Messages.DEFS[name]["fields"].values():
			for rule in rules:
				if rule.has("segments"):
					patterns[rule["pattern"]] = rule["segments"]
	_expect(patterns.size() >= 3, "only %d patterns with segments" % patterns.size())
	var samples := [
		"marla",
		"a",
		"",
		"x".repeat(128),
		"x".repeat(129),
		"set_waypoint",
		"_x",
		"9lives",
		"a.b:c-d",
		"not an id",
		"sil",
		"AA",
		"a\n",
		"é",
		"bad!"
	]
	for pattern in patterns:
		var regex := RegEx.new()
		regex.compile(pattern)
		for text in samples:
			var found := regex.search(text)
			var by_regex: bool = found != null and found.get_end() == text.length()
			var by_runs: bool = _protocol._matches_segments(text, patterns[pattern])
			_expect(
				by_regex == by_runs,
				"%s on %s: regex %s, runs %s" % [pattern, to_json(text), by_regex, by_runs]
			)
	return _result()


func test_server_frames_that_cannot_be_read_are_typed_errors() -> String:
	var delta := (
		'{"schema_version": "v1", "type": "LLMStreamDelta", "npc_id": "marla", '
		+ '"session_id": "s-1", "turn_id": "t-1", "seq": %s, "delta": "Hi"}'
	)
	var cases := [
		['{"schema_version": "v1", "type": ', "bad_json", ""],
		["[1, 2, 3]", "not_an_object", ""],
		['"v1"', "not_an_object", ""],
		[
			'{"schema_version": "v2", "type": "LLMStreamDelta"}',
			"bad_schema_version",
			"schema_version"
		],
		['{"type": "Welcome"}', "bad_schema_version", "schema_version"],
		['{"schema_version": "v1", "type": "Teleport"}', "unknown_type", "type"],
		['{"schema_version": "v1", "type": 5}', "unknown_type", "type"],
		[
			'{"schema_version": "v1", "type": "SceneUpdate", "npc_id": "marla"}',
			"unknown_type",
			"type"
		],
		[delta % "-1", "invalid_message", "LLMStreamDelta.seq"],
		[delta % "1.5", "invalid_message", "LLMStreamDelta.seq"],
		[delta % '"0"', "invalid_message", "LLMStreamDelta.seq"],
	]
	for case in cases:
		var read = _protocol.parse_server_frame(case[0])
		if not read is MythicError:
			_failures.append("read: %s" % case[0])
			continue
		_expect(
			read.kind == MythicError.PROTOCOL and read.code == case[1],
			"%s: %s" % [case[0], str(read)]
		)
		_expect(read.ref == case[2], "%s: ref %s" % [case[0], read.ref])
	var read = _protocol.parse_server_frame(delta % "3")
	_expect(
		typeof(read) == TYPE_DICTIONARY and typeof(read["seq"]) == TYPE_INT and read["seq"] == 3,
		str(read)
	)
	return _result()


func test_audio_frames_are_mya1_a_little_endian_length_the_header_then_the_pcm() -> String:
	var header := {
		"schema_version": "v1",
		"type": "AudioChunk",
		"npc_id": "marla",
		"session_id": "s-1",
		"sample_rate": 16000,
		"ts_client": 0
	}
	var pcm := PoolByteArray([1, 2, 3, 4, 250, 251])
	var frame := _protocol.encode_audio_frame(header, pcm)
	var json := to_json(header).to_utf8()
	_expect(frame.subarray(0, 3).get_string_from_ascii() == "MYA1", "magic")
	_expect(
		frame[4] + (frame[5] << 8) + (frame[6] << 16) + (frame[7] << 24) == json.size(),
		"header length"
	)
	_expect(frame.subarray(8, 7 + json.size()).get_string_from_utf8() == to_json(header), "header")
	_expect(frame.subarray(8 + json.size(), frame.size() - 1) == pcm, "pcm")
	var tts := {
		"schema_version": "v1",
		"type": "TTSChunk",
		"npc_id": "marla",
		"session_id": "s-1",
		"turn_id": "t-1",
		"seq": 0,
		"sample_rate": 22050,
		"visemes": [{"t": 0, "p": "sil"}, {"t": 0.02, "p": "PP"}]
	}
	var chunk = _protocol.decode_audio_frame(_protocol.encode_audio_frame(tts, pcm))
	_expect(typeof(chunk) == TYPE_DICTIONARY, "decoded: %s" % str(chunk))
	if typeof(chunk) == TYPE_DICTIONARY:
		_expect(Protocol.pcm_of(chunk) == pcm, "pcm back")
		_expect(chunk["visemes"][1]["p"] == "PP" and chunk["seq"] == 0, "header back")
	var bad := [
		PoolByteArray([77, 89, 65]),
		"NOPE".to_ascii() + PoolByteArray([2, 0, 0, 0]) + "{}".to_ascii(),
		"MYA1".to_ascii() + PoolByteArray([255, 255, 255, 127]) + "{}".to_ascii(),
		_protocol.encode_audio_frame(_with(tts, "pcm", "AAAA"), pcm),
		_protocol.encode_audio_frame(_with(tts, "type", "AudioChunk"), pcm),
	]
	for data in bad:
		var refused = _protocol.decode_audio_frame(data)
		_expect(refused is MythicError and refused.code == "bad_audio_frame", str(refused))
	var newer = _protocol.decode_audio_frame(
		_protocol.encode_audio_frame(_with(tts, "schema_version", "v2"), pcm)
	)
	_expect(newer is MythicError and newer.code == "bad_schema_version", str(newer))
	return _result()


func test_a_turns_text_has_a_space_after_the_part_before_a_tool_call() -> String:
	var turn := MythicTurn.new(NoClient.new(), "marla", "t-1")
	var base := {
		"schema_version": "v1",
		"type": "LLMStreamDelta",
		"npc_id": "marla",
		"session_id": "s-1",
		"turn_id": "t-1"
	}
	turn._receive(_with(_with(base, "seq", 0), "delta", "Follow me."))
	turn._receive(
		_with(
			_with(_with(_with(base, "seq", 1), "delta", ""), "final", true),
			"finish_reason",
			"tool_call"
		)
	)
	_expect(not turn.over, "over after the tool call")
	turn._receive(_with(_with(base, "seq", 2), "delta", "It is close."))
	turn._receive(
		_with(
			_with(_with(_with(base, "seq", 3), "delta", ""), "final", true), "finish_reason", "stop"
		)
	)
	_expect(turn.text() == "Follow me. It is close.", to_json(turn.text()))
	_expect(turn.over and turn.finish_reason == "stop", "finish_reason %s" % turn.finish_reason)
	return _result()


func test_lip_sync_follows_the_recorded_voice() -> String:
	var chunks := _recorded()
	if chunks.empty():
		return "no recorded chunks in %s" % RECORDED
	var shapes := {
		"PP": "mouth_closed",
		"FF": "lip_bite",
		"aa": "jaw_open",
		"E": "mouth_wide",
		"ih": "mouth_wide",
		"oh": "mouth_round",
		"ou": "mouth_round",
		"nn": "tongue_up",
		"DD": "tongue_up",
		"TH": "tongue_up",
		"RR": "mouth_round",
		"CH": "lips_out",
		"SS": "teeth",
		"kk": "jaw_open"
	}
	var lips := MythicLipSync.new(shapes, 0.04)
	var seconds := 0.0
	var marks := []
	for chunk in chunks:
		_expect(Protocol.pcm_of(chunk).size() % 2 == 0, "PCM of 16-bit samples")
		for viseme in chunk["visemes"]:
			_expect(viseme["p"] in MythicLipSync.VISEMES, "viseme %s" % viseme["p"])
			marks.append([seconds + viseme["t"], viseme["p"]])
		seconds += Protocol.pcm_of(chunk).size() / 2.0 / chunk["sample_rate"]
		lips.add_chunk(chunk)
	_expect(abs(lips.length() - seconds) < 0.0001, "length %s, audio %s" % [lips.length(), seconds])
	_expect(lips.length() > 0.5, "a line of %s s" % lips.length())
	var spoken := {}
	for i in range(marks.size()):
		var end: float = marks[i + 1][0] if i + 1 < marks.size() else seconds
		if end > marks[i][0]:
			var middle: float = (marks[i][0] + end) / 2
			_expect(
				lips.viseme_at(middle) == marks[i][1],
				"at %s: %s, not %s" % [middle, lips.viseme_at(middle), marks[i][1]]
			)
			spoken[marks[i][1]] = true
	_expect(
		spoken.has("PP") and spoken.has("aa") and spoken.has("sil"),
		"visemes %s" % to_json(spoken.keys())
	)
	var t := 0.0
	while t < seconds + 0.1:
		var weights := lips.weights_at(t)
		var total := 0.0
		for weight in weights.values():
			_expect(weight >= 0.0 and weight <= 1.0, "a weight of %s at %s" % [weight, t])
			total += weight
		_expect(total <= 1.0001, "weights sum to %s at %s" % [total, t])
		var showing := lips.viseme_at(t)
		var settled := lips.viseme_at(t - 0.04) == showing and lips.viseme_at(t - 0.02) == showing
		if settled and shapes.has(showing):
			_expect(
				abs(weights[shapes[showing]] - 1.0) < 0.0001,
				"%s at %s: %s" % [showing, t, to_json(weights)]
			)
		if settled and not shapes.has(showing):
			_expect(total < 0.0001, "the mouth at rest at %s: %s" % [t, to_json(weights)])
		t += 0.005
	_expect(lips.viseme_at(seconds + 0.01) == "sil", "after the line")
	lips.clear()
	_expect(lips.length() == 0.0 and lips.viseme_at(0.1) == "sil", "clear")
	return _result()


func test_lip_sync_moves_a_meshes_blend_shapes() -> String:
	var chunks := _recorded()
	if chunks.empty():
		return "no recorded chunks in %s" % RECORDED
	var face := _face(["jaw_open", "mouth_closed"])
	var lips := MythicLipSync.new({"aa": "jaw_open", "PP": "mouth_closed"}, 0.0)
	for chunk in chunks:
		lips.add_chunk(chunk)
	var t := 0.0
	var seen := {}
	while t < lips.length():
		lips.apply(face, t)
		var showing := lips.viseme_at(t)
		_expect_shape(face, "jaw_open", 1.0 if showing == "aa" else 0.0, "%s at %s" % [showing, t])
		_expect_shape(
			face, "mouth_closed", 1.0 if showing == "PP" else 0.0, "%s at %s" % [showing, t]
		)
		seen[showing] = true
		t += 0.01
	_expect(seen.has("aa") and seen.has("PP"), "shapes seen: %s" % to_json(seen.keys()))
	face.free()
	return _result()


func test_audio_frames_are_the_pcm_samples_as_levels() -> String:
	var chunk := {
		"pcm": Marshalls.raw_to_base64(PoolByteArray([0, 0, 0, 64, 0, 192, 255, 127, 0, 128]))
	}
	var frames := Protocol.audio_frames(chunk)
	var levels := []
	for frame in frames:
		_expect(frame.x == frame.y, "a mono frame")
		levels.append(frame.x)
	_expect(levels == [0.0, 0.5, -0.5, 32767 / 32768.0, -1.0], to_json(levels))
	for recorded in _recorded():
		_expect(
			Protocol.audio_frames(recorded).size() * 2 == Protocol.pcm_of(recorded).size(),
			"a frame a sample"
		)
	return _result()


func test_the_talking_face_example_moves_its_lips_with_the_recorded_voice() -> String:
	var chunks := _recorded()
	if chunks.empty():
		return "no recorded chunks in %s" % RECORDED
	var example := TalkingFace.new()
	var face := _face(["mouth_closed", "lip_bite", "jaw_open", "mouth_wide", "mouth_round"])
	face.name = "Face"
	example.add_child(face)
	var voice := AudioStreamPlayer3D.new()
	voice.name = "Voice"
	voice.stream = AudioStreamGenerator.new()
	voice.stream.buffer_length = 2.0  # the whole line at once: a server sends it at its pace
	example.add_child(voice)
	Engine.get_main_loop().root.add_child(example)
	example.set_process(false)  # the test steps it
	for chunk in chunks:
		example.speak(chunk)
	_expect(
		voice.stream.mix_rate == chunks[0]["sample_rate"], "mix rate %s" % voice.stream.mix_rate
	)
	_expect(voice.get_stream_playback() != null, "the voice does not play")
	var steps := 0
	var opened := 0
	while example.played_s < example.lips.length():
		example._process(0.01)
		steps += 1
		var showing: String = example.lips.viseme_at(example.played_s)
		var jaw: float = face.get("blend_shapes/jaw_open")
		if showing == "aa" and example.lips.viseme_at(example.played_s - 0.06) == "aa":
			_expect(jaw == 1.0, "jaw_open %s at %s" % [jaw, example.played_s])
			opened += 1
		if showing == "sil" and example.lips.viseme_at(example.played_s - 0.06) == "sil":
			_expect_shape(face, "mouth_closed", 0.0, "at rest at %s" % example.played_s)
	_expect(opened > 0, "the jaw never opened")
	_expect(
		steps == int(ceil(example.lips.length() / 0.01)),
		"%d steps for %s s" % [steps, example.lips.length()]
	)
	example.free()
	return _result()


# A MeshInstance of one triangle with these blend shapes.
static func _face(shapes: Array) -> MeshInstance:
	var mesh := ArrayMesh.new()
	for shape in shapes:
		mesh.add_blend_shape(shape)
	var arrays := []
	arrays.resize(Mesh.ARRAY_MAX)
	arrays[Mesh.ARRAY_VERTEX] = PoolVector3Array([Vector3.ZERO, Vector3.UP, Vector3.RIGHT])
	var moved := arrays.duplicate()
	moved[Mesh.ARRAY_VERTEX] = PoolVector3Array([Vector3.ZERO, Vector3.UP * 2, Vector3.RIGHT])
	var blends := []
	for _shape in shapes:
		blends.append(moved)
	mesh.add_surface_from_arrays(Mesh.PRIMITIVE_TRIANGLES, arrays, blends)
	var face := MeshInstance.new()
	face.mesh = mesh
	return face


func _expect_shape(face: MeshInstance, shape: String, weight: float, when: String) -> void:
	var actual: float = face.get("blend_shapes/%s" % shape)
	_expect(abs(actual - weight) < 0.0001, "%s %s, not %s: %s" % [shape, actual, weight, when])


func _recorded() -> Array:
	var file := File.new()
	if file.open(RECORDED, File.READ) != OK:
		return []
	var data = parse_json(file.get_as_text())
	file.close()
	var chunks := []
	for message in data["chunks"]:
		var read = _protocol.parse_server_frame(to_json(message))
		if read is MythicError:
			_failures.append("a recorded chunk is not a TTSChunk: %s" % str(read))
		else:
			chunks.append(read)
	return chunks


func _expect(holds: bool, what: String) -> void:
	if not holds:
		_failures.append(what)


func _result() -> String:
	var failures := PoolStringArray(_failures.slice(0, 4) if _failures.size() > 5 else _failures)
	var more := "" if _failures.size() <= 5 else " (+%d more)" % (_failures.size() - 4)
	_failures.clear()
	return failures.join("; ") + more


static func _with(message: Dictionary, key: String, value) -> Dictionary:
	var copy := message.duplicate(true)
	copy[key] = value
	return copy
