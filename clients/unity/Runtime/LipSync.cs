using System;
using System.Collections.Generic;
using System.Linq;

namespace Mythic.Client
{
    /// <summary>The 15 visemes of the Oculus/Meta lip-sync set that <c>TTSChunk.visemes</c> carries
    /// (mythic.speech.VISEMES), in that set's order.</summary>
    public static class Visemes
    {
        /// <summary><c>sil</c> (mouth at rest), <c>PP</c> (p b m), <c>FF</c> (f v), <c>TH</c>,
        /// <c>DD</c> (t d), <c>kk</c> (k g h), <c>CH</c> (ch j sh), <c>SS</c> (s z), <c>nn</c>
        /// (n l), <c>RR</c>, <c>aa</c>, <c>E</c>, <c>ih</c>, <c>oh</c>, <c>ou</c>.</summary>
        public static readonly IReadOnlyList<string> All = new[]
        {
            "sil", "PP", "FF", "TH", "DD", "kk", "CH", "SS", "nn", "RR", "aa", "E", "ih", "oh", "ou",
        };
    }

    /// <summary>How each viseme moves a face rig: its blend shapes and how far (0-1). Build one
    /// per rig (<see cref="OculusVisemes"/>, <see cref="ArKit"/>, or <see cref="Map"/> by hand);
    /// <see cref="Weights"/> writes one weight per shape, in <see cref="Shapes"/>' order.</summary>
    public sealed class BlendShapeMap
    {
        private readonly List<string> _shapes = new List<string>();
        private readonly Dictionary<string, List<KeyValuePair<int, float>>> _targets = new Dictionary<string, List<KeyValuePair<int, float>>>();

        /// <summary>The rig's blend shapes this map moves, in the order of the weights.</summary>
        public IReadOnlyList<string> Shapes => _shapes;

        /// <summary>Viseme <paramref name="viseme"/> moves <paramref name="shape"/> to
        /// <paramref name="weight"/> (added to what it already moves).</summary>
        public BlendShapeMap Map(string viseme, string shape, float weight = 1f)
        {
            if (!Visemes.All.Contains(viseme))
                throw new ArgumentException(viseme + " is not one of the 15 visemes (Visemes.All)", "viseme");
            if (weight < 0f || weight > 1f)
                throw new ArgumentOutOfRangeException("weight", weight, "a blend shape weight is 0-1");
            var index = _shapes.IndexOf(shape);
            if (index < 0)
            {
                index = _shapes.Count;
                _shapes.Add(shape);
            }
            List<KeyValuePair<int, float>> targets;
            if (!_targets.TryGetValue(viseme, out targets))
                _targets[viseme] = targets = new List<KeyValuePair<int, float>>();
            targets.Add(new KeyValuePair<int, float>(index, weight));
            return this;
        }

        /// <summary>A rig with one blend shape per viseme, named <paramref name="prefix"/> and the
        /// viseme (<c>viseme_aa</c>: Ready Player Me and Oculus LipSync avatars). <c>sil</c> is the
        /// rest pose: it moves nothing.</summary>
        public static BlendShapeMap OculusVisemes(string prefix = "viseme_")
        {
            var map = new BlendShapeMap();
            foreach (var viseme in Visemes.All.Where(v => v != "sil"))
                map.Map(viseme, prefix + viseme);
            return map;
        }

        /// <summary>A rig with Apple ARKit's face blend shapes (<c>jawOpen</c>, <c>mouthClose</c>,
        /// <c>mouthFunnel</c>, ...): each viseme as a mix of them.</summary>
        public static BlendShapeMap ArKit()
        {
            return new BlendShapeMap()
                .Map("PP", "mouthClose", 0.6f).Map("PP", "mouthPressLeft", 0.5f).Map("PP", "mouthPressRight", 0.5f)
                .Map("FF", "mouthRollLower", 0.7f).Map("FF", "mouthUpperUpLeft", 0.3f).Map("FF", "mouthUpperUpRight", 0.3f)
                .Map("TH", "jawOpen", 0.15f).Map("TH", "tongueOut", 0.6f)
                .Map("DD", "jawOpen", 0.2f).Map("DD", "mouthShrugUpper", 0.2f)
                .Map("kk", "jawOpen", 0.25f).Map("kk", "mouthStretchLeft", 0.2f).Map("kk", "mouthStretchRight", 0.2f)
                .Map("CH", "mouthFunnel", 0.6f).Map("CH", "jawOpen", 0.15f)
                .Map("SS", "mouthStretchLeft", 0.35f).Map("SS", "mouthStretchRight", 0.35f).Map("SS", "jawOpen", 0.05f)
                .Map("nn", "jawOpen", 0.2f).Map("nn", "mouthShrugUpper", 0.1f)
                .Map("RR", "mouthFunnel", 0.3f).Map("RR", "jawOpen", 0.2f)
                .Map("aa", "jawOpen", 0.7f)
                .Map("E", "jawOpen", 0.4f).Map("E", "mouthStretchLeft", 0.3f).Map("E", "mouthStretchRight", 0.3f)
                .Map("ih", "jawOpen", 0.25f).Map("ih", "mouthSmileLeft", 0.4f).Map("ih", "mouthSmileRight", 0.4f)
                .Map("oh", "jawOpen", 0.5f).Map("oh", "mouthFunnel", 0.5f)
                .Map("ou", "mouthPucker", 0.8f).Map("ou", "jawOpen", 0.15f);
        }

        /// <summary>Adds <paramref name="amount"/> of <paramref name="viseme"/> to
        /// <paramref name="weights"/> (one per shape); a label outside the map moves nothing.</summary>
        public void Add(string viseme, float amount, float[] weights)
        {
            List<KeyValuePair<int, float>> targets;
            if (viseme == null || !_targets.TryGetValue(viseme, out targets))
                return;
            foreach (var target in targets)
                weights[target.Key] = Math.Min(1f, weights[target.Key] + target.Value * amount);
        }
    }

    /// <summary>An NPC's mouth over time: the viseme marks of its speech chunks, each placed at its
    /// chunk's start in the audio stream. A viseme holds from its mark to the next; the new one
    /// fades in over <see cref="BlendSeconds"/> while the old one fades out.</summary>
    public sealed class VisemeTrack
    {
        private readonly List<KeyValuePair<double, string>> _marks = new List<KeyValuePair<double, string>>();

        /// <summary>How long a viseme takes to replace the one before (coarticulation): shorter
        /// than a phoneme (Piper speaks one each 20-100 ms), or the mouth never reaches a shape.</summary>
        public double BlendSeconds { get; set; } = 0.02;

        /// <summary>The marks held, time (seconds of the stream) and viseme.</summary>
        public IReadOnlyList<KeyValuePair<double, string>> Marks => _marks;

        /// <summary>Adds a chunk's visemes (<c>t</c>: seconds from the chunk's start) for a chunk
        /// that starts <paramref name="chunkStart"/> seconds into the stream. A mark before the last
        /// one held is moved up to it: the track only goes forward.</summary>
        public void Add(double chunkStart, IEnumerable<Viseme> visemes)
        {
            foreach (var v in visemes)
            {
                var t = chunkStart + v.T;
                if (_marks.Count > 0 && t < _marks[_marks.Count - 1].Key)
                    t = _marks[_marks.Count - 1].Key;
                _marks.Add(new KeyValuePair<double, string>(t, v.P));
            }
        }

        public void Clear()
        {
            _marks.Clear();
        }

        /// <summary>The viseme showing at <paramref name="t"/> (null before the first mark).</summary>
        public string At(double t)
        {
            var i = IndexAt(t);
            return i < 0 ? null : _marks[i].Value;
        }

        /// <summary>The rig's weights at <paramref name="t"/>: the viseme there, faded in from the
        /// one before, through <paramref name="map"/>. Marks long past are dropped.</summary>
        public void Weights(double t, BlendShapeMap map, float[] weights)
        {
            Array.Clear(weights, 0, weights.Length);
            var i = IndexAt(t);
            if (i < 0)
                return;
            var into = BlendSeconds <= 0 ? 1.0 : Math.Min(1.0, (t - _marks[i].Key) / BlendSeconds);
            map.Add(_marks[i].Value, (float)into, weights);
            if (i > 0 && into < 1.0)
                map.Add(_marks[i - 1].Value, (float)(1.0 - into), weights);
            if (i > 1)
                _marks.RemoveRange(0, i - 1);
        }

        private int IndexAt(double t)
        {
            var i = -1;
            while (i + 1 < _marks.Count && _marks[i + 1].Key <= t)
                i++;
            return i;
        }
    }

    /// <summary>An NPC's streamed voice, without any engine: TTSChunks in (from any thread), mono
    /// float samples out (<see cref="Read"/>, from the audio thread), and the mouth's blend shape
    /// weights at the sample being played (<see cref="MouthWeights"/>). Unity's
    /// <c>NPCSpeaker</c> feeds an AudioSource and a SkinnedMeshRenderer with it.</summary>
    public sealed class SpeechPlayback
    {
        private readonly object _gate = new object();
        private readonly Queue<float> _samples = new Queue<float>();
        private readonly VisemeTrack _track = new VisemeTrack();
        private readonly BlendShapeMap _map;
        private long _written;
        private long _played;

        /// <param name="map">The rig's blend shapes.</param>
        /// <param name="npcId">Only this NPC's chunks are played (null: every chunk given).</param>
        /// <param name="sampleRate">The rate <see cref="Read"/> gives samples at (Unity's output
        /// rate); 0: the first chunk's.</param>
        public SpeechPlayback(BlendShapeMap map, string npcId = null, int sampleRate = 0)
        {
            if (sampleRate < 0)
                throw new ArgumentOutOfRangeException("sampleRate", sampleRate, "samples per second, or 0");
            _map = map;
            NpcId = npcId;
            SampleRate = sampleRate;
        }

        public string NpcId { get; }

        /// <summary>Samples per second of what <see cref="Read"/> gives: the one given, else the
        /// first chunk's (0 before it). Chunks at another rate are resampled to it.</summary>
        public int SampleRate { get; private set; }

        /// <summary>Seconds of audio played so far (the playhead).</summary>
        public double PlayedSeconds
        {
            get
            {
                lock (_gate)
                    return SampleRate == 0 ? 0 : (double)_played / SampleRate;
            }
        }

        /// <summary>Seconds of audio received and not played yet.</summary>
        public double BufferedSeconds
        {
            get
            {
                lock (_gate)
                    return SampleRate == 0 ? 0 : (double)_samples.Count / SampleRate;
            }
        }

        /// <summary>Queues a chunk's audio and visemes; another NPC's chunk is ignored.</summary>
        public void Add(TtsChunk chunk)
        {
            if (NpcId != null && chunk.NpcId != NpcId)
                return;
            var pcm = chunk.PcmBytes;
            lock (_gate)
            {
                if (SampleRate == 0)
                    SampleRate = (int)chunk.SampleRate;
                var start = (double)_written / SampleRate;
                var count = pcm.Length / 2;
                var step = (double)chunk.SampleRate / SampleRate;
                for (var x = 0.0; x < count; x += step)
                {
                    var i = (int)x;
                    var a = (short)(pcm[2 * i] | pcm[2 * i + 1] << 8) / 32768f;
                    var b = i + 1 < count ? (short)(pcm[2 * i + 2] | pcm[2 * i + 3] << 8) / 32768f : a;
                    _samples.Enqueue(a + (b - a) * (float)(x - i));
                    _written++;
                }
                _track.Add(start, chunk.Visemes ?? Enumerable.Empty<Viseme>());
            }
        }

        /// <summary>Fills <paramref name="data"/> with the next samples (each repeated over
        /// <paramref name="channels"/> interleaved channels); silence where none are queued.
        /// Returns how many frames were real audio.</summary>
        public int Read(float[] data, int channels = 1)
        {
            var frames = 0;
            lock (_gate)
            {
                for (var at = 0; at + channels <= data.Length; at += channels)
                {
                    var sample = 0f;
                    if (_samples.Count > 0)
                    {
                        sample = _samples.Dequeue();
                        _played++;
                        frames++;
                    }
                    for (var c = 0; c < channels; c++)
                        data[at + c] = sample;
                }
            }
            return frames;
        }

        /// <summary>Drops what is not played yet (the NPC was cut off).</summary>
        public void Stop()
        {
            lock (_gate)
            {
                _samples.Clear();
                _written = _played;
                _track.Clear();
            }
        }

        /// <summary>The mouth at the playhead, one weight (0-1) per shape of the map.</summary>
        public void MouthWeights(float[] weights)
        {
            lock (_gate)
            {
                if (SampleRate == 0)
                {
                    Array.Clear(weights, 0, weights.Length);
                    return;
                }
                _track.Weights((double)_played / SampleRate, _map, weights);
            }
        }
    }
}
