# Every error the addon reports, as a value (GDScript has no exceptions): a coroutine or method
# that fails returns one, a turn that fails holds one, and errors of no turn come as events.
# Branch on `kind` and `code` (stable), not on `message`.
extends Reference

# The server refused something: `error` is its Error message, `code` and `ref` are its own.
const SERVER = "server"
# The server sent a frame this client cannot read (not JSON, an unknown type, a newer
# schema_version, fields outside the schema); the frame was skipped. `code` says which.
const PROTOCOL = "protocol"
# A message this client was asked to send breaks the v1 schema; nothing was sent. `ref` is the
# offending field as a dotted path (`PlayerUtterance.text`).
const VALIDATION = "validation"
# The connection dropped (or could not be made); a turn in flight ends with this.
const CONNECTION_LOST = "connection_lost"
# A bounded wait ran out: no Welcome, no answer, no next event within the client's timeout_s.
const TIMEOUT = "timeout"
# The client was used in a way it cannot work (not connected yet, a session without voice).
const USAGE = "usage"

var kind: String
var code: String
var message: String
var ref := ""
var retryable := false
var turn_id := ""
var call_id := ""
# The server's Error message, for kind SERVER; empty otherwise.
var error := {}


func _init(
	error_kind: String, error_code: String, text: String, field_ref := "", can_retry := false
) -> void:
	kind = error_kind
	code = error_code
	message = text
	ref = field_ref
	retryable = can_retry


func _to_string() -> String:
	return "%s %s: %s" % [kind, code, message]
