# Messages to frames and back: validation against the generated v1 definitions, JSON frames
# and binary audio frames. Every failure is a MythicError returned as a value; nothing here
# raises a script error for any input.
extends Reference

const Messages = preload("generated/messages.gd")
const MythicError = preload("mythic_error.gd")

const SCHEMA_VERSION = Messages.SCHEMA_VERSION
# The first four bytes of a binary audio frame.
const AUDIO_FRAME_MAGIC = "MYA1"

# Compiled RegEx by pattern (patterns that are not runs of character classes).
var _regexes := {}


# The message ready to send, `schema_version` filled in and the whole checked against the
# client's side of the schema, its cross-field rules included (an Ack of a ToolCall carries its
# call_id; a resume gives session_id and resume_token together); a MythicError (kind
# VALIDATION, `ref` the offending field) when it breaks it.
func check_outgoing(message: Dictionary):
	var checked := {"schema_version": SCHEMA_VERSION}
	for key in message:
		checked[key] = message[key]
	var type = checked.get("type")
	if typeof(type) != TYPE_STRING or not type in Messages.CLIENT_TYPES:
		var why := "is not a v1 message type"
		if type in Messages.SERVER_TYPES:
			why = "is not sent by a client"
		return MythicError.new(
			MythicError.VALIDATION, "invalid_message", "%s %s" % [str(type), why], "type"
		)
	var wrong = violation(checked, type)
	if wrong != null:
		return MythicError.new(
			MythicError.VALIDATION, "invalid_message", "%s: %s" % wrong, wrong[0]
		)
	return checked


# Reads one JSON frame from the server: the message, or a MythicError (kind PROTOCOL, code
# bad_json, not_an_object, bad_schema_version, unknown_type or invalid_message).
func parse_server_frame(text: String):
	var obj = _json_object(text, "a frame")
	if obj is MythicError:
		return obj
	return _server_message(obj)


# The first schema violation of `obj` as a definition `name`: [dotted ref, why], or null.
func violation(obj: Dictionary, name: String, path := ""):
	var definition: Dictionary = Messages.DEFS[name]
	if path == "":
		path = name
	for field in definition["required"]:
		if not obj.has(field):
			return ["%s.%s" % [path, field], "is required"]
	for field in obj:
		var ref := "%s.%s" % [path, str(field)]
		if typeof(field) != TYPE_STRING or not definition["fields"].has(field):
			return [ref, "is not a field of %s" % name]
		var wrong = _value_violation(obj[field], definition["fields"][field], ref)
		if wrong != null:
			return wrong
	for rule in Messages.RULES.get(name, []):
		var wrong = _cross_field_violation(obj, rule, path)
		if wrong != null:
			return wrong
	return null


# A binary audio frame: MYA1, the header's length (4 bytes, little-endian), the message as
# JSON without `pcm` (the header), then the raw 16-bit little-endian PCM.
func encode_audio_frame(header: Dictionary, pcm: PoolByteArray) -> PoolByteArray:
	var json := to_json(header).to_utf8()
	var frame := AUDIO_FRAME_MAGIC.to_ascii()
	var size := json.size()
	for shift in [0, 8, 16, 24]:
		frame.append((size >> shift) & 0xff)
	frame.append_array(json)
	frame.append_array(pcm)
	return frame


# A TTSChunk from a binary frame: the message with `pcm` in base64, as in JSON frames (`pcm_of`
# gives its bytes); a MythicError (kind PROTOCOL, code bad_audio_frame or the header's) else.
func decode_audio_frame(frame: PoolByteArray):
	if frame.size() < 8 or frame.subarray(0, 3).get_string_from_ascii() != AUDIO_FRAME_MAGIC:
		return _protocol("bad_audio_frame", "a binary frame from the server must start with MYA1")
	var size: int = frame[4] | (frame[5] << 8) | (frame[6] << 16) | (frame[7] << 24)
	if size < 1 or size > frame.size() - 8:
		return _protocol(
			"bad_audio_frame",
			"the audio header claims %d bytes; the frame has %d" % [size, frame.size() - 8]
		)
	var header = _json_object(frame.subarray(8, 7 + size).get_string_from_utf8(), "an audio header")
	if header is MythicError:
		return header
	if (
		typeof(header.get("type")) != TYPE_STRING
		or header["type"] != "TTSChunk"
		or header.has("pcm")
	):
		return _protocol(
			"bad_audio_frame", "a binary frame from the server is a TTSChunk header without pcm"
		)
	var pcm := PoolByteArray()
	if frame.size() > 8 + size:
		pcm = frame.subarray(8 + size, frame.size() - 1)
	header["pcm"] = Marshalls.raw_to_base64(pcm)
	return _server_message(header)


# The PCM bytes of a TTSChunk or AudioChunk message (16-bit little-endian mono samples).
static func pcm_of(chunk: Dictionary) -> PoolByteArray:
	return Marshalls.base64_to_raw(chunk.get("pcm", ""))


# A TTSChunk's audio as the frames an AudioStreamGeneratorPlayback plays (`push_buffer`): one
# Vector2 (left, right) a sample, -1 to 1. Play them at the chunk's sample_rate (the generator's
# mix_rate).
static func audio_frames(chunk: Dictionary) -> PoolVector2Array:
	var pcm := pcm_of(chunk)
	var frames := PoolVector2Array()
	frames.resize(pcm.size() / 2)
	for i in range(frames.size()):
		var sample: int = pcm[2 * i] | (pcm[2 * i + 1] << 8)
		if sample >= 32768:
			sample -= 65536
		var level := sample / 32768.0
		frames[i] = Vector2(level, level)
	return frames


func _server_message(obj: Dictionary):
	var version = obj.get("schema_version")
	if typeof(version) != TYPE_STRING or version != SCHEMA_VERSION:
		return _protocol(
			"bad_schema_version",
			(
				"the server speaks schema_version %s, this client %s: use a client release of %s"
				% [to_json(version), SCHEMA_VERSION, "the server's protocol version"]
			),
			"schema_version"
		)
	var type = obj.get("type")
	if typeof(type) != TYPE_STRING or not type in Messages.SERVER_TYPES:
		return _protocol(
			"unknown_type",
			"the server sent a message of type %s, which a v1 server never sends" % to_json(type),
			"type"
		)
	var wrong = violation(obj, type)
	if wrong != null:
		return _protocol("invalid_message", "the server sent %s: %s" % wrong, wrong[0])
	# JSON numbers arrive as floats; the schema's integers (seq, sample_rate) become ints.
	var fields: Dictionary = Messages.DEFS[type]["fields"]
	for field in obj:
		if typeof(obj[field]) == TYPE_REAL and fields[field][0].get("type") == "integer":
			obj[field] = int(obj[field])
	return obj


func _json_object(text: String, what: String):
	var parsed := JSON.parse(text)
	if parsed.error != OK:
		return _protocol(
			"bad_json",
			(
				"the server sent %s that is not JSON: %s (line %d)"
				% [what, parsed.error_string, parsed.error_line]
			)
		)
	if typeof(parsed.result) != TYPE_DICTIONARY:
		return _protocol("not_an_object", "the server sent %s that is not a JSON object" % what)
	return parsed.result


func _protocol(code: String, text: String, field_ref := "") -> MythicError:
	return MythicError.new(MythicError.PROTOCOL, code, text, field_ref)


# The violation of a cross-field rule (`if`/`then`/`else`, generated/messages.gd's RULES) by
# an object whose fields are each valid: [dotted ref, why], or null.
func _cross_field_violation(obj: Dictionary, rule: Dictionary, path: String):
	var met: bool = _part_violation(obj, rule["if"], path) == null
	var part = rule.get("then") if met else rule.get("else")
	if part == null:
		return null
	var wrong = _part_violation(obj, part, path)
	if wrong == null:
		return null
	return [wrong[0], "%s %s %s" % [wrong[1], "when" if met else "unless", _condition(rule["if"])]]


# The violation of one part of a cross-field rule: a field it requires is missing, or a field
# there does not match the part's rules for it.
func _part_violation(obj: Dictionary, part: Dictionary, path: String):
	for field in part["required"]:
		if not obj.has(field):
			return ["%s.%s" % [path, field], "is required"]
	for field in part["fields"]:
		if obj.has(field):
			var ref := "%s.%s" % [path, field]
			var wrong = _value_violation(obj[field], part["fields"][field], ref)
			if wrong != null:
				return wrong
	return null


# What a rule's `if` asks, in words: `ack_of is "ToolCall"`, `session_id is a string`.
static func _condition(part: Dictionary) -> String:
	var said := PoolStringArray()
	for field in part["required"]:
		if not part["fields"].has(field):
			said.append("%s is there" % field)
	for field in part["fields"]:
		var kinds := PoolStringArray()
		for rule in part["fields"][field]:
			var kind: String = rule.get("type", rule.get("ref", "value"))
			if rule.has("const"):
				kinds.append(to_json(rule["const"]))
			else:
				kinds.append(("an " if kind[0] in "aeiou" else "a ") + kind)
		said.append("%s is %s" % [field, kinds.join(" or ")])
	return said.join(" and ")


# The violation of `value` against a field's rules (it must match one), or null.
func _value_violation(value, rules: Array, ref: String):
	var first = null
	for rule in rules:
		if not _has_type(value, rule):
			continue
		var wrong = _rule_violation(value, rule, ref)
		if wrong == null:
			return null
		if first == null:
			first = wrong
	if first != null:
		return first
	var kinds := []
	for rule in rules:
		kinds.append(rule.get("type", rule.get("ref", "")))
	return [ref, "is not %s" % PoolStringArray(kinds).join(" or ")]


func _has_type(value, rule: Dictionary) -> bool:
	if rule.has("ref"):
		return typeof(value) == TYPE_DICTIONARY
	match rule["type"]:
		"string":
			return typeof(value) == TYPE_STRING
		"integer":
			return (
				typeof(value) == TYPE_INT
				or (typeof(value) == TYPE_REAL and value == floor(value))
			)
		"number":
			return typeof(value) == TYPE_INT or typeof(value) == TYPE_REAL
		"boolean":
			return typeof(value) == TYPE_BOOL
		"null":
			return typeof(value) == TYPE_NIL
		"object":
			return typeof(value) == TYPE_DICTIONARY
		"array":
			return typeof(value) == TYPE_ARRAY
	return true


# The violation of a value of the rule's type against its constraints, or null.
func _rule_violation(value, rule: Dictionary, ref: String):
	if rule.has("ref"):
		return violation(value, rule["ref"], ref)
	if rule.has("const") and value != rule["const"]:
		return [ref, "must be %s" % to_json(rule["const"])]
	if rule.has("enum") and not value in rule["enum"]:
		return [ref, "must be one of %s" % to_json(rule["enum"])]
	if rule.has("min_length") and value.length() < rule["min_length"]:
		return [ref, "must have at least %d characters" % rule["min_length"]]
	if rule.has("max_length") and value.length() > rule["max_length"]:
		return [ref, "must have at most %d characters" % rule["max_length"]]
	if rule.has("pattern") and not _matches(value, rule):
		return [ref, "must match %s" % rule["pattern"]]
	if rule.has("minimum") and value < rule["minimum"]:
		return [ref, "must be >= %s" % str(rule["minimum"])]
	if rule.has("maximum") and value > rule["maximum"]:
		return [ref, "must be <= %s" % str(rule["maximum"])]
	if rule.has("min_items") and value.size() < rule["min_items"]:
		return [ref, "must have at least %d items" % rule["min_items"]]
	if rule.has("max_items") and value.size() > rule["max_items"]:
		return [ref, "must have at most %d items" % rule["max_items"]]
	if rule.get("unique_items", false):
		for i in range(value.size()):
			for j in range(i):
				if typeof(value[i]) == typeof(value[j]) and value[i] == value[j]:
					return ["%s.%d" % [ref, i], "must not repeat an item"]
	if rule.has("items"):
		for i in range(value.size()):
			var wrong = _value_violation(value[i], rule["items"], "%s.%d" % [ref, i])
			if wrong != null:
				return wrong
	return null


func _matches(text: String, rule: Dictionary) -> bool:
	if rule.has("segments"):
		return _matches_segments(text, rule["segments"])
	var pattern: String = rule["pattern"]
	if not _regexes.has(pattern):
		var regex := RegEx.new()
		regex.compile(pattern)
		_regexes[pattern] = regex
	var found: RegExMatch = _regexes[pattern].search(text)
	# PCRE's `$` also matches before a final newline; the schema's (ECMA-262) does not.
	return found != null and (not pattern.ends_with("$") or found.get_end() == text.length())


# Whether `text` is, whole, the runs of characters `segments` allow: [characters, min, max]
# each (a pattern like ^[A-Za-z][A-Za-z0-9_.]{0,63}$, checked without RegEx on the hot path
# of every message). Each run takes all it can: the generator emits segments only where that
# is exact (no later run may start with a character a run of variable length takes).
func _matches_segments(text: String, segments: Array) -> bool:
	var at := 0
	for segment in segments:
		var count := 0
		while count < segment[2] and at < text.length() and segment[0].find(text[at]) >= 0:
			at += 1
			count += 1
		if count < segment[1]:
			return false
	return at == text.length()
