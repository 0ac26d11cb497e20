# The addon's tests, headless:
#
#     godot3-server --no-window --path clients/godot -s res://test/run_tests.gd
#
# The unit tests and the peer tests (the client against a scripted server) always run; with
# MYTHIC_URL (a running `mythic serve`'s ws://.../v1/ws) the conformance suite
# (MYTHIC_CONFORMANCE_DIR, default ../conformance/scenarios; its audio clips from
# MYTHIC_CONFORMANCE_AUDIO) and the example of docs/engines/godot.md run against it too. One
# line per test, `ok - KIND: NAME` or `not ok - KIND: NAME: why`, then `# pass N` and
# `# fail N`; the exit code is 1 on a failure.
extends SceneTree

const ConformancePlayer = preload("conformance_player.gd")
const ExampleTests = preload("example_tests.gd")
const PeerTests = preload("peer_tests.gd")
const UnitTests = preload("unit_tests.gd")
const Wait = preload("res://addons/mythic/mythic_wait.gd")

var _passed := 0
var _failed := 0


func _init() -> void:
	call_deferred("_run")


func _run() -> void:
	var units := UnitTests.new()
	for name in _tests_of(units):
		_report("unit", name.trim_prefix("test_"), units.call(name))
	var peers := PeerTests.new()
	root.add_child(peers)
	for name in _tests_of(peers):
		var failure = yield(Wait.settle(peers.call(name), 60, "end of the test"), "completed")
		_report("peer", name.trim_prefix("test_"), failure)
	peers.queue_free()
	var url := OS.get_environment("MYTHIC_URL")
	if url != "":
		var dir := OS.get_environment("MYTHIC_CONFORMANCE_DIR")
		if dir == "":
			dir = ProjectSettings.globalize_path("res://").plus_file("../conformance/scenarios")
		var scenarios := ConformancePlayer.scenarios(dir)
		var audio := OS.get_environment("MYTHIC_CONFORMANCE_AUDIO")
		if scenarios.size() < 10:
			_report(
				"conformance",
				"the suite holds scenarios",
				"only %d scenarios in %s" % [scenarios.size(), dir]
			)
		for scenario in scenarios:
			var player := ConformancePlayer.new(url, scenario["name"], audio)
			root.add_child(player)
			var failure = yield(player.play(scenario["steps"]), "completed")
			player.queue_free()
			_report("conformance", scenario["name"], failure)
		var examples := ExampleTests.new(url)
		root.add_child(examples)
		_report(
			"example",
			"a first NPC line with a tool handler",
			yield(examples.first_line(), "completed")
		)
		_report("example", "a tavern scene", yield(examples.tavern(), "completed"))
		examples.queue_free()
	else:
		print("# MYTHIC_URL is not set: the conformance suite and the example did not run")
	print("# pass %d" % _passed)
	print("# fail %d" % _failed)
	OS.exit_code = 1 if _failed > 0 else 0
	quit()


func _report(kind: String, name: String, failure) -> void:
	if typeof(failure) == TYPE_STRING and failure == "":
		_passed += 1
		print("ok - %s: %s" % [kind, name])
	else:
		_failed += 1
		print("not ok - %s: %s: %s" % [kind, name, str(failure).replace("\n", " ")])


# The names of an object's test_ methods, sorted.
static func _tests_of(tests: Object) -> Array:
	var names := []
	for method in tests.get_method_list():
		if method["name"].begins_with("test_"):
			names.append(method["name"])
	names.sort()
	return names
