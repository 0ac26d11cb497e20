# Bounded waits in Godot 3's coroutines (yield): each ends with the value waited for, or with
# a MythicError of kind TIMEOUT. Every one yields at least once, so `yield(x, "completed")`
# on it always works.
extends Reference

const MythicError = preload("mythic_error.gd")


class _Result:
	extends Reference
	var done := false
	var value = null

	func _on_completed(result = null) -> void:
		value = result
		done = true


# The value of `value`: awaited first (bounded by `timeout_s`) when it is a coroutine's
# GDScriptFunctionState, as it is at once otherwise.
static func settle(value, timeout_s: float, what: String):
	var tree: SceneTree = Engine.get_main_loop()
	if not value is GDScriptFunctionState:
		yield(tree, "idle_frame")
		return value
	var result := _Result.new()
	value.connect("completed", result, "_on_completed")
	var deadline := OS.get_ticks_msec() + int(timeout_s * 1000)
	while not result.done:
		if OS.get_ticks_msec() >= deadline:
			return timeout(what, timeout_s)
		yield(tree, "idle_frame")
	return result.value


# Waits until `object.method(args...)` is true, one check a frame; true, or a MythicError
# (TIMEOUT).
static func until(object: Object, method: String, timeout_s: float, what: String, args := []):
	var tree: SceneTree = Engine.get_main_loop()
	var deadline := OS.get_ticks_msec() + int(timeout_s * 1000)
	yield(tree, "idle_frame")
	while not object.callv(method, args):
		if OS.get_ticks_msec() >= deadline:
			return timeout(what, timeout_s)
		yield(tree, "idle_frame")
	return true


# Waits `seconds` (a game-time timer).
static func sleep(seconds: float):
	var tree: SceneTree = Engine.get_main_loop()
	yield(tree.create_timer(seconds), "timeout")


static func timeout(what: String, timeout_s: float) -> MythicError:
	return MythicError.new(
		MythicError.TIMEOUT, "timeout", "no %s within %s s" % [what, str(timeout_s)], "", true
	)
