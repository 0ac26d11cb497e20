# The example of docs/engines/godot.md (examples/first_npc.gd), run against a real server: the
# line is answered, the tool handler ran and the tool's result was voiced.
extends Node

const FirstNpc = preload("res://examples/first_npc.gd")
const Tavern = preload("res://examples/tavern.gd")
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


# Coroutine: "" when the tavern example played its scene as the page says, else why not.
func tavern():
	_shown.clear()
	var example := Tavern.new()
	example.connect("shown", self, "_on_shown")
	add_child(example)
	var talks = yield(Wait.settle(example.tavern(_url), 600, "the tavern scene"), "completed")
	example.queue_free()
	if talks is MythicError:
		return str(talks)
	var screen := PoolStringArray(_shown).join("|")
	if talks.size() != 4:
		return "%d talks: %s" % [talks.size(), screen]
	var firsts := []
	for talk in talks:
		if talk.error != null:
			return "a line failed: %s" % talk.error
		var speakers: Array = talk.speakers()
		firsts.append(speakers[0] if not speakers.empty() else "")
		for reply in talk.replies:
			if not reply["finish_reason"] in ["stop", "length"]:
				return "a reply ended %s: %s" % [reply["finish_reason"], screen]
	if firsts != ["captain_strand", "countess_isolde", "marla", "marla"]:
		return "answered by %s: %s" % [to_json(firsts), screen]
	if talks[0].turns[0]["chosen_by"] != "name" or talks[1].turns[0]["chosen_by"] != "to":
		return "chosen by %s, %s" % [talks[0].turns[0]["chosen_by"], talks[1].turns[0]["chosen_by"]]
	if "captain_strand" in talks[2].speakers():
		return "the captain spoke while out: %s" % screen
	if talks[0].reply_text(talks[0].replies[0]).strip_edges() == "":
		return "no words: %s" % screen
	return ""
