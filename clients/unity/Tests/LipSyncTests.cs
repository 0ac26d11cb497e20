using System;
using System.IO;
using System.Linq;
using Newtonsoft.Json.Linq;
using NUnit.Framework;

namespace Mythic.Client.Tests
{
    /// <summary>The viseme-to-blend-shape mapping and the speech playback, on a TTSChunk a real
    /// <c>mythic serve</c> sent with voice on (Fixtures/tts_chunk.json, recorded by
    /// record_speech_fixture.py): its binary frame read by the SDK's own decoder.</summary>
    [TestFixture]
    public class LipSyncTests
    {
        private static string Fixtures =>
            Environment.GetEnvironmentVariable("MYTHIC_UNITY_FIXTURES") ?? Path.Combine("..", "Tests", "Fixtures");

        private static TtsChunk Recorded()
        {
            var record = JObject.Parse(File.ReadAllText(Path.Combine(Fixtures, "tts_chunk.json")));
            return Protocol.DecodeAudioFrame(Convert.FromBase64String((string)record["frame_base64"]));
        }

        [Test]
        public void The_recorded_chunk_is_a_whole_TTSChunk_with_a_forward_viseme_track()
        {
            var chunk = Recorded();
            Assert.AreEqual("marla", chunk.NpcId);
            Assert.AreEqual(22050, chunk.SampleRate);
            Assert.AreEqual(0, chunk.PcmBytes.Length % 2);
            var seconds = chunk.PcmBytes.Length / 2.0 / chunk.SampleRate;
            Assert.That(seconds >= 0.03 && seconds <= 0.1, "a chunk is 40-80 ms: " + seconds);
            Assert.GreaterOrEqual(chunk.Visemes.Count, 3);
            var times = chunk.Visemes.Select(v => v.T).ToList();
            CollectionAssert.IsOrdered(times);
            Assert.That(times.All(t => t >= 0 && t < seconds), "marks inside the chunk");
            CollectionAssert.IsSubsetOf(chunk.Visemes.Select(v => v.P).ToList(), Visemes.All.ToList());
        }

        [Test]
        public void Each_viseme_moves_its_own_shape_when_its_blend_is_done()
        {
            var chunk = Recorded();
            var map = BlendShapeMap.OculusVisemes();
            Assert.AreEqual(14, map.Shapes.Count, "sil moves nothing");
            var track = new VisemeTrack();
            track.Add(0, chunk.Visemes);
            var weights = new float[map.Shapes.Count];
            var settledMarks = 0;
            for (var i = 0; i < chunk.Visemes.Count; i++)
            {
                var mark = chunk.Visemes[i];
                var next = i + 1 < chunk.Visemes.Count ? chunk.Visemes[i + 1].T : double.MaxValue;
                var settled = mark.T + track.BlendSeconds;
                if (settled >= next)
                    continue; // replaced before it settles
                track.Weights(settled, map, weights); // times go forward: marks long past may be dropped
                var expected = map.Shapes.Select(s => s == "viseme_" + mark.P ? 1f : 0f).ToArray();
                CollectionAssert.AreEqual(expected, weights, mark.P + " at " + settled);
                settledMarks++;
            }
            Assert.GreaterOrEqual(settledMarks, 2, "the recorded marks are far enough apart to settle");
        }

        [Test]
        public void A_new_viseme_fades_in_while_the_one_before_fades_out()
        {
            var chunk = Recorded();
            var map = BlendShapeMap.OculusVisemes();
            // The first change between two shapes that move the rig (sil moves nothing).
            var i = Enumerable.Range(1, chunk.Visemes.Count - 1).First(k => chunk.Visemes[k].P != "sil" && chunk.Visemes[k - 1].P != "sil" && chunk.Visemes[k].P != chunk.Visemes[k - 1].P);
            var track = new VisemeTrack();
            track.Add(1.0, chunk.Visemes);
            var weights = new float[map.Shapes.Count];
            track.Weights(1.0 + chunk.Visemes[i].T + track.BlendSeconds / 4, map, weights);
            var before = weights[map.Shapes.ToList().IndexOf("viseme_" + chunk.Visemes[i - 1].P)];
            var now = weights[map.Shapes.ToList().IndexOf("viseme_" + chunk.Visemes[i].P)];
            Assert.AreEqual(0.25f, now, 1e-4);
            Assert.AreEqual(0.75f, before, 1e-4);
            Assert.AreEqual(1f, weights.Sum(), 1e-4);
        }

        [Test]
        public void Playback_plays_the_chunks_pcm_and_moves_the_mouth_at_the_playhead()
        {
            var chunk = Recorded();
            var map = BlendShapeMap.ArKit();
            var playback = new SpeechPlayback(map, "marla");
            playback.Add(chunk);
            playback.Add(Recorded()); // the same chunk again: its marks come one chunk later
            var samples = chunk.PcmBytes.Length / 2;
            Assert.AreEqual(22050, playback.SampleRate);
            Assert.AreEqual(2.0 * samples / 22050, playback.BufferedSeconds, 1e-9);

            var firstChange = chunk.Visemes.First(v => v.P != "sil");
            var until = (int)Math.Ceiling((firstChange.T + 0.02) * 22050);
            var stereo = new float[2 * until];
            Assert.AreEqual(until, playback.Read(stereo, 2));
            var pcm0 = (short)(chunk.PcmBytes[0] | chunk.PcmBytes[1] << 8) / 32768f;
            Assert.AreEqual(pcm0, stereo[0]);
            Assert.AreEqual(pcm0, stereo[1], "each sample on both channels");
            Assert.AreEqual((double)until / 22050, playback.PlayedSeconds, 1e-9);

            var weights = new float[map.Shapes.Count];
            playback.MouthWeights(weights);
            var expected = new float[map.Shapes.Count];
            map.Add(firstChange.P, 1f, expected);
            CollectionAssert.AreEqual(expected, weights);
            Assert.That(weights.Any(w => w > 0) && weights.All(w => w >= 0 && w <= 1));

            playback.Stop(); // cut off: nothing left to play, the mouth at rest
            Assert.AreEqual(0, playback.BufferedSeconds);
            Assert.AreEqual(0, playback.Read(new float[64]));
            playback.MouthWeights(weights);
            Assert.That(weights.All(w => w == 0));
        }

        [Test]
        public void Another_npcs_chunk_is_not_played_and_a_bad_map_is_refused()
        {
            var playback = new SpeechPlayback(BlendShapeMap.OculusVisemes(), "bran");
            playback.Add(Recorded());
            Assert.AreEqual(0, playback.BufferedSeconds);
            Assert.Throws<ArgumentException>(() => new BlendShapeMap().Map("AA", "jawOpen"));
            Assert.Throws<ArgumentOutOfRangeException>(() => new BlendShapeMap().Map("aa", "jawOpen", 2f));
        }
    }
}
