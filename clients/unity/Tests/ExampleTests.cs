// The sample (Samples~) is compiled with these tests by tests/integration/test_sdk_csharp.py; in
// Unity it is imported into the project, outside this test assembly, so it is left out there.
#if !UNITY_2017_1_OR_NEWER
using System.Collections.Generic;
using System.Text.RegularExpressions;
using System.Threading.Tasks;
using Mythic.Samples;
using NUnit.Framework;

namespace Mythic.Client.Tests
{
    /// <summary>The sample's code (Samples~/FirstNpc/FirstNpc.cs, the code of
    /// docs/engines/unity.md) against a real <c>mythic serve</c>.</summary>
    [TestFixture]
    public class ExampleTests
    {
        [Test]
        public async Task The_first_npc_example_gets_a_streamed_reply()
        {
            if (ConformanceTests.Url == null)
                Assert.Ignore("set MYTHIC_URL to a running `mythic serve`");
            var shown = new List<string>();
            var reply = await FirstNpc.RunAsync(ConformanceTests.Url, shown.Add);
            StringAssert.StartsWith("session s-", shown[0]);
            Assert.Greater(shown.Count, 1, "the reply streamed");
            Assert.IsNotEmpty(reply.Trim());
            var pieces = string.Concat(shown.GetRange(1, shown.Count - 1));
            Assert.AreEqual(Regex.Replace(reply, "\\s", ""), Regex.Replace(pieces, "\\s", ""), "the pieces are the reply (a tool call adds a space)");
        }
    }
}
#endif
