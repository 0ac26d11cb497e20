# Registers MythicClient as a node type of the editor's "Create New Node" dialog. The addon
# works without enabling the plugin too: preload the scripts (docs/engines/godot.md).
tool
extends EditorPlugin


func _enter_tree() -> void:
	add_custom_type("MythicClient", "Node", preload("mythic_client.gd"), null)


func _exit_tree() -> void:
	remove_custom_type("MythicClient")
