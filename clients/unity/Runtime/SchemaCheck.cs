using System;
using System.Collections.Generic;
using System.Globalization;
using System.Linq;
using System.Text.RegularExpressions;
using Newtonsoft.Json.Linq;

namespace Mythic.Client
{
    /// <summary>Checks a message against its definition in one of the v1 JSON Schemas (the
    /// keywords <c>mythic schema export</c> writes: type, const, enum, anyOf/oneOf, allOf,
    /// if/then/else, $ref, properties, required, additionalProperties, string lengths, pattern,
    /// number bounds, items, item counts, uniqueItems). Newtonsoft.Json.Schema is not free
    /// software; the subset is small.</summary>
    internal sealed class SchemaCheck
    {
        private readonly JObject _defs;
        private readonly Dictionary<string, Regex> _patterns = new Dictionary<string, Regex>();

        internal SchemaCheck(string schemaJson)
        {
            var schema = JObject.Parse(schemaJson);
            _defs = (JObject)schema["$defs"];
            Types = new HashSet<string>(((JObject)schema["discriminator"]["mapping"]).Properties().Select(p => p.Name));
        }

        /// <summary>The message types of this side of the protocol.</summary>
        internal ISet<string> Types { get; }

        /// <summary>The first violation of <paramref name="message"/> against the definition of its
        /// type, as a dotted ref (<c>SceneUpdate.time</c>) and a sentence; null when it is valid.</summary>
        internal Tuple<string, string> Violation(string type, JObject message)
        {
            var path = new List<string> { type };
            lock (_patterns)
            {
                var why = Check(_defs[type], message, path);
                if (why == null)
                    return null;
                var @ref = string.Join(".", path);
                return Tuple.Create(@ref, @ref + ": " + why);
            }
        }

        private string Check(JToken schema, JToken value, List<string> path)
        {
            if (schema.Type == JTokenType.Boolean)
                return (bool)schema ? null : "is not allowed";
            var s = (JObject)schema;
            var reference = (string)s["$ref"];
            if (reference != null)
            {
                var why = Check(_defs[reference.Substring("#/$defs/".Length)], value, path);
                if (why != null)
                    return why;
            }
            var branches = (JArray)(s["anyOf"] ?? s["oneOf"]);
            if (branches != null)
            {
                var why = Branches(branches, value, path);
                if (why != null)
                    return why;
            }
            var type = (string)s["type"];
            if (type != null && !IsType(value, type))
                return "must be " + (type == "null" ? "" : type == "object" || type == "array" || type == "integer" ? "an " : "a ") + type;
            JToken constant;
            if (s.TryGetValue("const", out constant) && !JToken.DeepEquals(constant, value))
                return "must be " + constant.ToString(Newtonsoft.Json.Formatting.None);
            var choices = (JArray)s["enum"];
            if (choices != null && !choices.Any(c => JToken.DeepEquals(c, value)))
                return "must be one of " + string.Join(", ", choices.Select(c => c.ToString(Newtonsoft.Json.Formatting.None)));
            var own = CheckOwn(s, value, path);
            if (own != null)
                return own;
            // The cross-field rules last: a field that is wrong by itself is named as such first.
            var all = (JArray)s["allOf"];
            if (all != null)
            {
                foreach (var part in all)
                {
                    var why = Check(part, value, path);
                    if (why != null)
                        return why;
                }
            }
            return s["if"] != null ? Conditional(s, value, path) : null;
        }

        private string CheckOwn(JObject s, JToken value, List<string> path)
        {
            switch (value.Type)
            {
                case JTokenType.String:
                    return CheckString(s, (string)value);
                case JTokenType.Integer:
                case JTokenType.Float:
                    return CheckNumber(s, (double)value);
                case JTokenType.Array:
                    return CheckArray(s, (JArray)value, path);
                case JTokenType.Object:
                    return CheckObject(s, (JObject)value, path);
                default:
                    return null;
            }
        }

        /// <summary>if/then/else: <c>then</c> holds when the value matches <c>if</c>, <c>else</c>
        /// when it does not. The error says which condition asked for it (<c>is required when
        /// ack_of is "ToolCall"</c>), since the field is fine by itself.</summary>
        private string Conditional(JObject s, JToken value, List<string> path)
        {
            var condition = s["if"];
            var holds = Check(condition, value, new List<string>(path)) == null;
            var rule = s[holds ? "then" : "else"];
            if (rule == null)
                return null;
            var why = Check(rule, value, path);
            if (why == null)
                return null;
            var when = Describe(condition);
            return when == null ? why : why + (holds ? " when " : " unless ") + when;
        }

        /// <summary>An <c>if</c> of required fields in words: <c>ack_of is "ToolCall"</c>,
        /// <c>session_id is given</c>; null for any other shape.</summary>
        private static string Describe(JToken condition)
        {
            var s = condition as JObject;
            var required = s == null ? null : s["required"] as JArray;
            if (required == null || required.Count == 0)
                return null;
            var properties = (JObject)s["properties"] ?? new JObject();
            return string.Join(" and ", required.Select(r =>
            {
                var field = properties[(string)r] as JObject;
                var constant = field == null ? null : field["const"];
                return (string)r + " is " + (constant == null ? "given" : constant.ToString(Newtonsoft.Json.Formatting.None));
            }));
        }

        /// <summary>anyOf/oneOf: valid when a branch holds. Otherwise the error of the branch of the
        /// value's own JSON type (a bad string is told what a string must be), else a summary.</summary>
        private string Branches(JArray branches, JToken value, List<string> path)
        {
            string closest = null;
            List<string> closestPath = null;
            foreach (var branch in branches)
            {
                var tried = new List<string>(path);
                var why = Check(branch, value, tried);
                if (why == null)
                    return null;
                var type = TypeOf(branch);
                if (closest == null && type != null && IsType(value, type))
                {
                    closest = why;
                    closestPath = tried;
                }
            }
            if (closest == null)
                return "matches none of the allowed forms";
            path.Clear();
            path.AddRange(closestPath);
            return closest;
        }

        /// <summary>A branch's JSON type, through its $ref (an optional part is a $ref or null).</summary>
        private string TypeOf(JToken branch)
        {
            var s = branch as JObject;
            if (s == null)
                return null;
            var reference = (string)s["$ref"];
            return (string)s["type"] ?? (reference == null ? null : (string)_defs[reference.Substring("#/$defs/".Length)]["type"]);
        }

        private static bool IsType(JToken value, string type)
        {
            switch (type)
            {
                case "object":
                    return value.Type == JTokenType.Object;
                case "array":
                    return value.Type == JTokenType.Array;
                case "string":
                    return value.Type == JTokenType.String;
                case "boolean":
                    return value.Type == JTokenType.Boolean;
                case "null":
                    return value.Type == JTokenType.Null;
                case "number":
                    return value.Type == JTokenType.Integer || value.Type == JTokenType.Float;
                case "integer":
                    if (value.Type == JTokenType.Integer)
                        return true;
                    if (value.Type != JTokenType.Float)
                        return false;
                    var d = (double)value;
                    return Math.Floor(d) == d && !double.IsInfinity(d);
                default:
                    return true;
            }
        }

        private string CheckString(JObject s, string text)
        {
            // JSON Schema counts code points; a surrogate pair is one.
            var length = text.Length - text.Count(char.IsLowSurrogate);
            var min = s["minLength"];
            if (min != null && length < (int)min)
                return (int)min == 1 ? "must not be empty" : "must be at least " + (int)min + " characters";
            var max = s["maxLength"];
            if (max != null && length > (int)max)
                return "must be at most " + (int)max + " characters";
            var pattern = (string)s["pattern"];
            if (pattern != null && !PatternOf(pattern).IsMatch(text))
                return "must match " + pattern;
            return null;
        }

        private Regex PatternOf(string pattern)
        {
            Regex regex;
            if (!_patterns.TryGetValue(pattern, out regex))
            {
                // .NET's $ also matches before a final newline; the schema's (ECMA 262) does not.
                var ecma = pattern.EndsWith("$", StringComparison.Ordinal) && !pattern.EndsWith("\\$", StringComparison.Ordinal)
                    ? pattern.Substring(0, pattern.Length - 1) + "(?![\\s\\S])"
                    : pattern;
                regex = new Regex(ecma, RegexOptions.ECMAScript | RegexOptions.CultureInvariant);
                _patterns[pattern] = regex;
            }
            return regex;
        }

        private static string CheckNumber(JObject s, double number)
        {
            var min = s["minimum"];
            if (min != null && number < (double)min)
                return "must be at least " + ((double)min).ToString(CultureInfo.InvariantCulture);
            var max = s["maximum"];
            if (max != null && number > (double)max)
                return "must be at most " + ((double)max).ToString(CultureInfo.InvariantCulture);
            var above = s["exclusiveMinimum"];
            if (above != null && number <= (double)above)
                return "must be more than " + ((double)above).ToString(CultureInfo.InvariantCulture);
            var below = s["exclusiveMaximum"];
            if (below != null && number >= (double)below)
                return "must be less than " + ((double)below).ToString(CultureInfo.InvariantCulture);
            return null;
        }

        private string CheckArray(JObject s, JArray array, List<string> path)
        {
            var min = s["minItems"];
            if (min != null && array.Count < (int)min)
                return "must have at least " + (int)min + " items";
            var max = s["maxItems"];
            if (max != null && array.Count > (int)max)
                return "must have at most " + (int)max + " items";
            var unique = s["uniqueItems"];
            if (unique != null && (bool)unique)
            {
                for (var i = 1; i < array.Count; i++)
                    for (var j = 0; j < i; j++)
                        if (JToken.DeepEquals(array[i], array[j]))
                            return "must not repeat an item";
            }
            var items = s["items"];
            if (items == null)
                return null;
            for (var i = 0; i < array.Count; i++)
            {
                path.Add(i.ToString(CultureInfo.InvariantCulture));
                var why = Check(items, array[i], path);
                if (why != null)
                    return why;
                path.RemoveAt(path.Count - 1);
            }
            return null;
        }

        private string CheckObject(JObject s, JObject obj, List<string> path)
        {
            var required = (JArray)s["required"];
            if (required != null)
            {
                foreach (var name in required.Select(r => (string)r))
                {
                    if (obj[name] == null)
                    {
                        path.Add(name);
                        return "is required";
                    }
                }
            }
            var properties = (JObject)s["properties"] ?? new JObject();
            var additional = s["additionalProperties"];
            foreach (var property in obj.Properties())
            {
                path.Add(property.Name);
                var field = properties[property.Name];
                if (field != null)
                {
                    var why = Check(field, property.Value, path);
                    if (why != null)
                        return why;
                }
                else if (additional != null)
                {
                    if (additional.Type == JTokenType.Boolean && !(bool)additional)
                        return "is not a field of this message";
                    var why = Check(additional, property.Value, path);
                    if (why != null)
                        return why;
                }
                path.RemoveAt(path.Count - 1);
            }
            return null;
        }
    }
}
