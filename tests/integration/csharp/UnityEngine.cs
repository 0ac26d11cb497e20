// The members of UnityEngine that the package's MonoBehaviours (Runtime/Unity/*.cs) and the
// sample's (Samples~/FirstNpc/FirstNpcBehaviour.cs) use, declared with the signatures of Unity's
// scripting reference (2021.3), so that Mono compiles those scripts against the real core
// assembly here, where Unity's own assemblies are not to be had. Declarations only: nothing
// here ever runs (tests/integration/test_sdk_csharp.py compiles, and never loads, the result).
// A script that calls the core wrongly fails this compile; one that calls Unity wrongly in a
// way these declarations do not model shows only in Unity.
using System;

namespace UnityEngine
{
    public class Object
    {
    }

    public class Component : Object
    {
        public T GetComponent<T>() { throw new NotSupportedException(); }
    }

    public class Behaviour : Component
    {
        public bool enabled { get; set; }
    }

    public class MonoBehaviour : Behaviour
    {
    }

    [AttributeUsage(AttributeTargets.Field)]
    public sealed class SerializeField : Attribute
    {
    }

    public abstract class PropertyAttribute : Attribute
    {
    }

    [AttributeUsage(AttributeTargets.Field, Inherited = true, AllowMultiple = false)]
    public class TooltipAttribute : PropertyAttribute
    {
        public readonly string tooltip;

        public TooltipAttribute(string tooltip) { this.tooltip = tooltip; }
    }

    [AttributeUsage(AttributeTargets.Class, AllowMultiple = true)]
    public sealed class RequireComponent : Attribute
    {
        public RequireComponent(Type requiredComponent) { }
    }

    public class Debug
    {
        public static void Log(object message) { throw new NotSupportedException(); }

        public static void LogWarning(object message) { throw new NotSupportedException(); }

        public static void LogError(object message) { throw new NotSupportedException(); }
    }

    public sealed class AudioSettings
    {
        public static int outputSampleRate { get { throw new NotSupportedException(); } }
    }

    public sealed class AudioClip : Object
    {
        public static AudioClip Create(string name, int lengthSamples, int channels, int frequency, bool stream)
        {
            throw new NotSupportedException();
        }
    }

    public sealed class AudioSource : Behaviour
    {
        public AudioClip clip { get; set; }

        public bool loop { get; set; }

        public void Play() { throw new NotSupportedException(); }
    }

    public sealed class Mesh : Object
    {
        public int GetBlendShapeIndex(string blendShapeName) { throw new NotSupportedException(); }
    }

    public class Renderer : Component
    {
    }

    public class SkinnedMeshRenderer : Renderer
    {
        public Mesh sharedMesh { get; set; }

        public void SetBlendShapeWeight(int index, float value) { throw new NotSupportedException(); }
    }
}
