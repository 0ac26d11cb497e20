# A first NPC line from Godot, with a game tool: the code of docs/engines/godot.md. The tests
# run it against a real server (test/example_tests.gd); in a game, attach it to a node.
extends Node

# A line for the game's screen: the NPC's words as they stream, its tool calls, how it ended.
signal shown(text)

# --8<-- [start:tool-handler]
const MythicClient = preload("res://addons/mythic/mythic_client.gd")
const MythicError = preload("res://addons/mythic/mythic_error.gd")


# The game's side of a tool call: do it, then answer with the result for the NPC to voice.
func set_waypoint(call: Dictionary) -> Dictionary:
	if call["name"] != "set_waypoint":
		return {"status": "rejected", "message": "not in this game"}
	return {"status": "ok", "result": {"distance_m": 140}}


# --8<-- [end:tool-handler]


# --8<-- [start:first-line]
# Says one line to Marla and shows her reply as it streams; the turn, or a MythicError.
func first_line(url: String):
	var client = MythicClient.new()
	client.url = url
	client.tool_handler = funcref(self, "set_waypoint")
	add_child(client)
	var welcome = yield(client.connect_to_server(), "completed")
	if welcome is MythicError:  # a refusal (kind "server", its code) or no connection
		show("cannot connect: %s" % welcome)
		return welcome
	client.scene("marla", "old_town", "21:10", {"player": 1.2})
	var turn = client.say(
		"marla", "Which way to Blackfen Marsh? Set a waypoint to blackfen_marsh for me."
	)
	turn.connect("delta", self, "_on_delta")
	turn.connect("tool_call", self, "_on_tool_call")
	var reply = yield(turn.reply(), "completed")  # the whole text, or a MythicError
	if reply is MythicError:
		show("the line failed: %s" % reply)
	show("[%s]" % turn.finish_reason)
	yield(client.close(), "completed")
	client.queue_free()
	return turn


func _on_delta(text: String, _delta: Dictionary) -> void:
	show(text)


func _on_tool_call(call: Dictionary) -> void:
	show("<game> %s %s" % [call["name"], to_json(call["args"])])


# --8<-- [end:first-line]


func show(text: String) -> void:
	emit_signal("shown", text)
