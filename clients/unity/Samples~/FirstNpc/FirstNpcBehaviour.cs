using Mythic.Client.Unity;
using UnityEngine;

namespace Mythic.Samples
{
    /// <summary>The sample scene's script: Marla answers the first line, sets waypoints, and
    /// speaks through the NPCSpeaker on her model. Needs a MythicConnection in the scene.</summary>
    public sealed class FirstNpcBehaviour : MonoBehaviour
    {
        [SerializeField] private MythicConnection connection;

        private void Awake()
        {
            connection.ToolHandler = FirstNpc.SetWaypoint;
        }

        private async void Start()
        {
            await connection.Connected;
            var reply = await FirstNpc.FirstLineAsync(connection.Client, piece => Debug.Log("Marla: " + piece));
            Debug.Log("Marla said: " + reply);
        }
    }
}
