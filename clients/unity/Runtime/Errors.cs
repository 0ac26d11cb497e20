using System;

namespace Mythic.Client
{
    /// <summary>Every error this client raises or reports; <see cref="Retryable"/> says whether
    /// trying again may help.</summary>
    public class MythicException : Exception
    {
        public MythicException(string message, bool retryable = false, Exception inner = null)
            : base(message, inner)
        {
            Retryable = retryable;
        }

        /// <summary>Whether the same request may succeed if tried again.</summary>
        public bool Retryable { get; }
    }

    /// <summary>The server refused something: an <c>Error</c> message it sent, as an exception.
    /// Branch on <see cref="Code"/> (stable), not on the message.</summary>
    public class ServerException : MythicException
    {
        public ServerException(Error error)
            : base(error.Code + ": " + error.Message, error.Retryable ?? false)
        {
            Error = error;
        }

        /// <summary>The server's message.</summary>
        public Error Error { get; }

        /// <summary>The stable error code (<c>unknown_npc</c>, <c>unknown_session</c>...).</summary>
        public string Code => Error.Code;

        /// <summary>The offending field or message type, when there is one.</summary>
        public string Ref => Error.Ref;

        public string TurnId => Error.TurnId;

        public string CallId => Error.CallId;
    }

    /// <summary>The server sent a frame this client cannot read: not JSON, a message type it does
    /// not know, a newer <c>schema_version</c> (upgrade the client), or fields outside the schema.
    /// The frame is skipped and reported (<see cref="MythicClient.NextEventAsync"/> and
    /// <see cref="MythicClient.Event"/>); nothing throws into the game loop.</summary>
    public class ProtocolException : MythicException
    {
        public ProtocolException(string code, string message, string @ref = null)
            : base(message)
        {
            Code = code;
            Ref = @ref;
        }

        /// <summary><c>bad_json</c>, <c>not_an_object</c>, <c>bad_schema_version</c>,
        /// <c>unknown_type</c>, <c>invalid_message</c> or <c>bad_audio_frame</c>.</summary>
        public string Code { get; }

        public string Ref { get; }
    }

    /// <summary>A message this client was asked to send breaks the v1 schema; it was not sent.
    /// <see cref="Ref"/> is the offending field as a dotted path (<c>PlayerUtterance.text</c>).</summary>
    public class ValidationException : MythicException
    {
        public ValidationException(string message, string @ref)
            : base(message)
        {
            Ref = @ref;
        }

        public string Ref { get; }
    }

    /// <summary>The connection dropped while a turn or a request was in flight; the client
    /// resumes the session by itself unless it was told to stop.</summary>
    public class ConnectionLostException : MythicException
    {
        public ConnectionLostException(string message, Exception inner = null)
            : base(message, true, inner) { }
    }

    /// <summary>A bounded wait ran out: no answer, no next event, no connection within the
    /// timeout.</summary>
    public class WaitTimeoutException : MythicException
    {
        public WaitTimeoutException(string message)
            : base(message, true) { }
    }
}
