# The other side of the boundary for the client's peer tests: a WebSocket server on loopback
# that welcomes every SessionStart, keeps what it received, and hands each message to the
# test's script (a FuncRef called with the peer, the connection's id and the message).
extends Node

const Messages = preload("res://addons/mythic/generated/messages.gd")

var port := 0
var welcome := true
var script_step: FuncRef = null
# What came in, in order: the messages (binary frames as {"binary": PoolByteArray}).
var received := []

var _server := WebSocketServer.new()


# Listens on a free loopback port; OK, or the last error.
func start() -> int:
	_server.connect("data_received", self, "_on_data")
	var error := ERR_CANT_OPEN
	for _try in range(20):
		port = 20000 + randi() % 40000
		_server.bind_ip = "127.0.0.1"
		error = _server.listen(port)
		if error == OK:
			return OK
	return error


func url() -> String:
	return "ws://127.0.0.1:%d/v1/ws" % port


func stop() -> void:
	_server.stop()


func send(id: int, message: Dictionary) -> void:
	send_text(id, to_json(message))


func send_text(id: int, text: String) -> void:
	var peer := _server.get_peer(id)
	peer.set_write_mode(WebSocketPeer.WRITE_MODE_TEXT)
	peer.put_packet(text.to_utf8())


func send_binary(id: int, data: PoolByteArray) -> void:
	var peer := _server.get_peer(id)
	peer.set_write_mode(WebSocketPeer.WRITE_MODE_BINARY)
	peer.put_packet(data)


# Closes every connection at once and listens again on the same port, as a server restart
# does. (Godot 3.2's server-side close(-1) leaves the TCP connection open: no drop at all.)
func restart() -> int:
	_server.stop()
	return _server.listen(port)


# The messages received of one type.
func of_type(type: String) -> Array:
	var found := []
	for message in received:
		if message.get("type") == type:
			found.append(message)
	return found


func _process(_delta: float) -> void:
	if _server.is_listening():
		_server.poll()


func _on_data(id: int) -> void:
	var peer := _server.get_peer(id)
	while peer.get_available_packet_count() > 0:
		var data := peer.get_packet()
		var message = {"binary": data}
		if peer.was_string_packet():
			message = parse_json(data.get_string_from_utf8())
		received.append(message)
		if welcome and message.get("type") == "SessionStart":
			send(
				id,
				{
					"schema_version": Messages.SCHEMA_VERSION,
					"type": "Welcome",
					"session_id": "s-1",
					"resume_token": "r-1",
					"max_frame_bytes": 262144,
					"resumed": message.get("resume_token") != null,
				}
			)
		if script_step != null:
			script_step.call_func(self, id, message)
