# An NPC's face that speaks: the voice's PCM played through an AudioStreamGenerator and the
# visemes moved onto the face's blend shapes; the lip-sync code of docs/engines/godot.md. The
# tests drive it with a line recorded from the server's voice (test/unit_tests.gd). In a game:
# a Spatial with a MeshInstance "Face" (blend shapes from your modeller) and an
# AudioStreamPlayer3D "Voice" whose stream is an AudioStreamGenerator.
extends Spatial

# --8<-- [start:lip-sync]
const MythicLipSync = preload("res://addons/mythic/mythic_lip_sync.gd")
const MythicProtocol = preload("res://addons/mythic/mythic_protocol.gd")

# Each viseme of the server's voice as a blend shape of this face; the others rest the mouth.
var lips = MythicLipSync.new(
	{
		"PP": "mouth_closed",
		"FF": "lip_bite",
		"aa": "jaw_open",
		"E": "mouth_wide",
		"ih": "mouth_wide",
		"oh": "mouth_round",
		"ou": "mouth_round"
	}
)
var played_s := 0.0  # seconds of the line played so far


# Connected to the client: client.connect("tts_chunk", face, "speak")
func speak(chunk: Dictionary) -> void:
	if chunk["seq"] == 0:  # a new line
		lips.clear()
		played_s = 0.0
		$Voice.stream.mix_rate = chunk["sample_rate"]
		$Voice.play()
	lips.add_chunk(chunk)
	$Voice.get_stream_playback().push_buffer(MythicProtocol.audio_frames(chunk))


func _process(delta: float) -> void:
	if played_s < lips.length():
		played_s += delta
		lips.apply($Face, played_s)
# --8<-- [end:lip-sync]
