# A tavern scene from Godot: the barkeep, a guard and a vampire noble at one table, the player's
# lines answered by the NPC they name or face, an NPC walking out and back in, the NPCs talking
# among themselves. The code of docs/engines/godot.md's "A scene"; the tests run it against a
# real server (test/example_tests.gd); in a game, attach it to a node.
extends Node

# A line for the game's screen: who answers, then their words as they stream.
signal shown(text)

const MythicClient = preload("res://addons/mythic/mythic_client.gd")
const MythicError = preload("res://addons/mythic/mythic_error.gd")


# --8<-- [start:tavern]
# Plays the scene, showing each reply with who says it; the scene's talks in order, or a
# MythicError.
func tavern(url: String):
	var client = MythicClient.new()
	client.url = url
	client.player_id = "tavern-guest"
	add_child(client)
	var welcome = yield(client.connect_to_server(), "completed")
	if welcome is MythicError:
		return welcome
	var scene = yield(
		client.start_scene("tavern", ["marla", "captain_strand", "countess_isolde"]), "completed"
	)
	if scene is MythicError:  # kind "server": an NPC the world lacks, too many, ...
		return scene
	var talks := []
	talks.append(yield(_show(scene.say("Captain Strand, when does the curfew begin?")), "completed"))
	talks.append(yield(_show(scene.say("What will you drink tonight?", "countess_isolde")), "completed"))
	yield(scene.leave("captain_strand"), "completed")  # she walks out: hears nothing more
	talks.append(yield(_show(scene.ambient(4, "the fog tonight", "marla")), "completed"))
	yield(scene.join("captain_strand"), "completed")  # back: she hears what follows
	talks.append(yield(_show(scene.say("Marla, one more ale before I go.")), "completed"))
	yield(scene.end("the player left the tavern"), "completed")
	yield(client.close(), "completed")
	client.queue_free()
	return talks


# Coroutine: shows a line's replies as they stream (who answers, then the words); the talk.
func _show(talk):
	talk.connect("turn", self, "_on_turn")
	talk.connect("delta", self, "_on_delta")
	yield(talk.wait(), "completed")
	return talk


func _on_turn(message: Dictionary) -> void:
	if not message["speakers"].empty():
		show("%s:" % PoolStringArray(message["speakers"]).join(", "))


func _on_delta(_npc_id: String, text: String, _message: Dictionary) -> void:
	show(text)


# --8<-- [end:tavern]


func show(text: String) -> void:
	emit_signal("shown", text)
