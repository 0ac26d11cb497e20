using System.Linq;
using UnityEngine;

namespace Mythic.Client.Unity
{
    /// <summary>Plays an NPC's streamed voice through this object's AudioSource and moves its face's
    /// blend shapes with the viseme track. The work is <see cref="SpeechPlayback"/>'s (Unity-free,
    /// tested): this component feeds it chunks, hands its samples to the audio thread
    /// (OnAudioFilterRead, at Unity's output rate) and writes its weights to the face each frame.</summary>
    [RequireComponent(typeof(AudioSource))]
    public sealed class NPCSpeaker : MonoBehaviour
    {
        [SerializeField] private MythicConnection connection;
        [SerializeField] private string npcId = "marla";
        [Tooltip("The face with the mouth's blend shapes; none: voice only.")]
        [SerializeField] private SkinnedMeshRenderer face;
        [Tooltip("Blend shapes named after the 15 visemes with this prefix (Ready Player Me: viseme_).")]
        [SerializeField] private string visemePrefix = "viseme_";
        [Tooltip("The face has ARKit's blend shapes (jawOpen, mouthFunnel...) instead.")]
        [SerializeField] private bool arKit;

        private SpeechPlayback _playback;
        private float[] _weights;
        private int[] _shapes;

        public string NpcId => npcId;

        private void Start()
        {
            var map = arKit ? BlendShapeMap.ArKit() : BlendShapeMap.OculusVisemes(visemePrefix);
            _playback = new SpeechPlayback(map, npcId, AudioSettings.outputSampleRate);
            _weights = new float[map.Shapes.Count];
            _shapes = map.Shapes.Select(s => face != null ? face.sharedMesh.GetBlendShapeIndex(s) : -1).ToArray();
            // The AudioSource plays a silent loop; OnAudioFilterRead writes the voice over it.
            var source = GetComponent<AudioSource>();
            source.clip = AudioClip.Create("mythic-" + npcId, AudioSettings.outputSampleRate, 1, AudioSettings.outputSampleRate, false);
            source.loop = true;
            source.Play();
            connection.Client.Speech += _playback.Add; // on the socket's thread: SpeechPlayback locks
            connection.Client.CutoffReceived += OnCutoff;
        }

        private void OnCutoff(Cutoff cutoff)
        {
            if (cutoff.NpcId == npcId)
                _playback.Stop();
        }

        private void OnAudioFilterRead(float[] data, int channels)
        {
            if (_playback != null)
                _playback.Read(data, channels);
        }

        private void Update()
        {
            if (face == null)
                return;
            _playback.MouthWeights(_weights);
            for (var i = 0; i < _shapes.Length; i++)
            {
                if (_shapes[i] >= 0)
                    face.SetBlendShapeWeight(_shapes[i], _weights[i] * 100f);
            }
        }

        private void OnDestroy()
        {
            if (_playback != null && connection != null && connection.Client != null)
            {
                connection.Client.Speech -= _playback.Add;
                connection.Client.CutoffReceived -= OnCutoff;
            }
        }
    }
}
