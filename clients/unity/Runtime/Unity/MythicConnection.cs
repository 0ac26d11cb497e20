using System;
using System.Collections.Concurrent;
using System.Threading;
using System.Threading.Tasks;
using UnityEngine;

namespace Mythic.Client.Unity
{
    /// <summary>A scene's connection to a Mythic server: one <see cref="MythicClient"/>, connected
    /// in Start and closed in OnDestroy. Tool calls run on the main thread (they may touch game
    /// objects); messages of no turn are raised on the main thread as <see cref="ServerEvent"/>.
    /// All the protocol is in the client; this component only ties it to a scene's life.</summary>
    public sealed class MythicConnection : MonoBehaviour
    {
        [SerializeField] private string url = "ws://127.0.0.1:8765/v1/ws";
        [SerializeField] private string playerId = "player";
        [Tooltip("Ask for the NPCs' voices (binary audio frames) for NPCSpeaker.")]
        [SerializeField] private bool voice = true;
        [SerializeField] private float timeoutSeconds = 30f;

        private readonly ConcurrentQueue<object> _events = new ConcurrentQueue<object>();

        /// <summary>The client: SayAsync, IntentAsync, SceneAsync... (after <see cref="Connected"/>).</summary>
        public MythicClient Client { get; private set; }

        /// <summary>Completes with the Welcome once Start has connected.</summary>
        public Task<Welcome> Connected { get; private set; }

        /// <summary>The game's tools: set it in Awake of the component that acts on them.</summary>
        public Func<ToolCall, Task<ToolResult>> ToolHandler { get; set; }

        /// <summary>Each message of no turn, or MythicException, on the main thread.</summary>
        public event Action<object> ServerEvent;

        private void Awake()
        {
            Client = new MythicClient(url, new MythicClientOptions
            {
                PlayerId = playerId,
                Voice = voice ? new VoiceFormat { Binary = true } : null,
                Timeout = TimeSpan.FromSeconds(timeoutSeconds),
                HandlerContext = SynchronizationContext.Current,
                ToolHandler = call => ToolHandler != null ? ToolHandler(call) : Task.FromResult(ToolResult.Rejected("no tool handler in this scene")),
            });
            Client.Event += _events.Enqueue;
        }

        private async void Start()
        {
            Connected = Client.ConnectAsync();
            try
            {
                await Connected;
            }
            catch (MythicException e)
            {
                Debug.LogError("Mythic: cannot connect to " + url + ": " + e.Message);
            }
        }

        private void Update()
        {
            object e;
            while (_events.TryDequeue(out e))
            {
                if (e is MythicException)
                    Debug.LogWarning("Mythic: " + ((MythicException)e).Message);
                if (ServerEvent != null)
                    ServerEvent(e);
            }
        }

        private async void OnDestroy()
        {
            Client.Event -= _events.Enqueue;
            try
            {
                await Client.CloseAsync();
            }
            catch (MythicException)
            {
                Client.Dispose();
            }
        }
    }
}
