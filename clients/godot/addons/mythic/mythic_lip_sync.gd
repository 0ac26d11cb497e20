# Lip-sync from the viseme track of an NPC's speech: the blend shape weights of its face at a
# time of playback. Feed it the TTSChunks as they come (`add_chunk`), play their PCM, and each
# frame `apply` the weights at the playback position.
extends Reference

const Protocol = preload("mythic_protocol.gd")

# The 15 visemes of the Oculus/Meta lip-sync set the server marks its speech with (the `p` of
# each Viseme), in that set's order.
const VISEMES = [
	"sil", "PP", "FF", "TH", "DD", "kk", "CH", "SS", "nn", "RR", "aa", "E", "ih", "oh", "ou"
]

# Viseme -> the face's blend shape for it. A viseme without one (`sil`, usually) is the mouth at
# rest: every weight falls to 0.
var shapes := {}
# Seconds over which one shape blends into the next.
var blend_s := 0.06

var _track := []  # [start of the viseme in seconds of playback, viseme], in time order
var _end_s := 0.0


func _init(viseme_shapes := {}, blend := 0.06) -> void:
	shapes = viseme_shapes
	blend_s = blend


# Adds a TTSChunk's visemes; its audio plays from `start_s` seconds of playback, by default
# right after the chunk before it.
func add_chunk(chunk: Dictionary, start_s := -1.0) -> void:
	var start := _end_s if start_s < 0 else start_s
	for viseme in chunk.get("visemes", []):
		_track.append([start + float(viseme["t"]), viseme["p"]])
	_end_s = max(_end_s, start + duration_of(chunk))


# Forgets the track (the NPC was cut off, or a new line starts).
func clear() -> void:
	_track.clear()
	_end_s = 0.0


# Seconds of speech added so far.
func length() -> float:
	return _end_s


# The viseme showing `t` seconds into playback: "sil" before the first and after the audio.
func viseme_at(t: float) -> String:
	var at := _index_at(t)
	return "sil" if at < 0 or t >= _end_s else _track[at][1]


# The blend shape weights at `t` seconds of playback (every shape of `shapes`, 0 to 1): the
# viseme showing rises over `blend_s` while the one before it falls.
func weights_at(t: float) -> Dictionary:
	var weights := {}
	for shape in shapes.values():
		weights[shape] = 0.0
	var at := _index_at(t)
	if at < 0 or t >= _end_s:
		return weights
	var rise := 1.0
	if blend_s > 0:
		rise = clamp((t - _track[at][0]) / blend_s, 0.0, 1.0)
	if at > 0:
		_add(weights, _track[at - 1][1], 1.0 - rise)
	_add(weights, _track[at][1], rise)
	return weights


# Sets a MeshInstance's blend shapes to the weights at `t` (Godot 3: the `blend_shapes/NAME`
# properties; Godot 4: MeshInstance3D.set_blend_shape_value).
func apply(mesh: MeshInstance, t: float) -> void:
	var weights := weights_at(t)
	for shape in weights:
		mesh.set("blend_shapes/%s" % shape, weights[shape])


# Seconds of audio in a TTSChunk (16-bit mono PCM at its sample_rate), from its base64 length.
static func duration_of(chunk: Dictionary) -> float:
	var pcm: String = chunk.get("pcm", "")
	var size := pcm.length() / 4 * 3 - int(pcm.ends_with("=")) - int(pcm.ends_with("=="))
	return size / 2.0 / float(chunk.get("sample_rate", 16000))


func _add(weights: Dictionary, viseme: String, weight: float) -> void:
	if shapes.has(viseme):
		weights[shapes[viseme]] += weight


# The last viseme that starts at or before `t` (binary search), or -1.
func _index_at(t: float) -> int:
	var low := 0
	var high := _track.size()
	while low < high:
		var middle := (low + high) / 2
		if _track[middle][0] <= t:
			low = middle + 1
		else:
			high = middle
	return low - 1
