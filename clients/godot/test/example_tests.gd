# The example of docs/engines/godot.md (examples/first_npc.gd), run against a real server: the
# line is answered, the tool handler ran and the tool's result was voiced.
extends Node

const FirstNpc = preload("res://examples/first_npc.gd")
const MythicError = preload("res://addons/mythic/mythic_error.gd")
const Wait = preload("res://addons/mythic/mythic_wait.gd")

var _url: String
var _shown := []


func _init(url: String) -> void:
	_url = url


# Coroutine: "" when the example did what the page says, else why not.
func first_line():
	var example := FirstNpc.new()
	example.connect("shown", self, "_on_shown")
	add_child(example)
	var turn = yield(Wait.settle(example.first_line(_url), 300, "the example's line"), "completed")
	example.queue_free()
	if turn is MythicError:
		return str(turn)
	var screen := PoolStringArray(_shown).join("|")
	var names := []
	for call in turn.tool_calls:
		names.append(call["name"])
	if names != ["set_waypoint"]:
		return "tool calls %s: %s" % [to_json(names), screen]
	if turn.text().strip_edges() == "" or not turn.finish_reason in ["stop", "length"]:
		return "no whole reply: %s" % screen
	if not '<game> set_waypoint {"target":"blackfen_marsh"}' in _shown:
		return "the tool call was not shown: %s" % screen
	return ""


func _on_shown(text: String) -> void:
	_shown.append(text)
