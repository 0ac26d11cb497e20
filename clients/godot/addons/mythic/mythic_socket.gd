# The WebSocket under the client, in Godot 3 (WebSocketClient). This file is the one part of
# the addon that is written against Godot's networking API; docs/engines/godot.md shows its
# Godot 4 version (WebSocketPeer).
extends Reference

signal opened
# The connection closed, or could not be made (`clean`: with a close handshake).
signal closed(clean)
signal received(data, is_text)

var _ws := WebSocketClient.new()
var _open := false
var _done := false


# `in_kb`, `out_kb`: the largest frame that can come in, go out (Godot's default is 64 KiB;
# the server takes frames up to its Welcome's max_frame_bytes).
func _init(in_kb := 512, out_kb := 512) -> void:
	_ws.set_buffers(in_kb, 1024, out_kb, 1024)
	_ws.connect("connection_established", self, "_on_established")
	_ws.connect("connection_closed", self, "_on_closed")
	_ws.connect("connection_error", self, "_on_closed", [false])
	_ws.connect("data_received", self, "_on_data")


func open(url: String) -> int:
	return _ws.connect_to_url(url)


func is_open() -> bool:
	return _open


# Whether the socket is finished with (closed, or never opened); `poll` does nothing then.
func is_done() -> bool:
	return _done


# Reads and writes what is due; call it every frame (MythicClient does).
func poll() -> void:
	if not _done:
		_ws.poll()


func send_text(text: String) -> int:
	if not _open:
		return ERR_UNCONFIGURED
	var peer := _ws.get_peer(1)
	peer.set_write_mode(WebSocketPeer.WRITE_MODE_TEXT)
	return peer.put_packet(text.to_utf8())


func send_binary(data: PoolByteArray) -> int:
	if not _open:
		return ERR_UNCONFIGURED
	var peer := _ws.get_peer(1)
	peer.set_write_mode(WebSocketPeer.WRITE_MODE_BINARY)
	return peer.put_packet(data)


# Closes with a close handshake; `closed` follows.
func close(code := 1000) -> void:
	if _done:
		return
	if _open:
		_ws.disconnect_from_host(code)
	else:
		_ws.disconnect_from_host()
		_on_closed(false)


# Drops the connection at once, without a close handshake (as a network drop does).
func abort() -> void:
	if _open:
		_ws.get_peer(1).close(-1)
	else:
		close()


func _on_established(_protocol: String) -> void:
	_open = true
	emit_signal("opened")


func _on_closed(clean: bool) -> void:
	if _done:
		return
	_open = false
	_done = true
	emit_signal("closed", clean)


func _on_data() -> void:
	var peer := _ws.get_peer(1)
	while peer.get_available_packet_count() > 0:
		var data := peer.get_packet()
		emit_signal("received", data, peer.was_string_packet())
