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

        [Test]
        public async Task The_tavern_example_plays_a_scene()
        {
            if (ConformanceTests.Url == null)
                Assert.Ignore("set MYTHIC_URL to a running `mythic serve`");
            var shown = new List<string>();
            var talks = await Tavern.RunAsync(ConformanceTests.Url, shown.Add);
            var said = string.Concat(shown);
            Assert.AreEqual(4, talks.Count, said);
            Assert.AreEqual("captain_strand", talks[0].Speakers[0], said);
            Assert.AreEqual(ChosenBy.Name, talks[0].Turns[0].ChosenBy, said);
            Assert.AreEqual("countess_isolde", talks[1].Speakers[0], said);
            Assert.AreEqual(ChosenBy.To, talks[1].Turns[0].ChosenBy, said);
            Assert.AreEqual("marla", talks[2].Speakers[0], said);
            CollectionAssert.DoesNotContain(talks[2].Speakers, "captain_strand", "she was out: " + said);
            Assert.AreEqual("marla", talks[3].Speakers[0], said);
            foreach (var talk in talks)
            {
                Assert.IsTrue(talk.Over, said);
                foreach (var reply in talk.Replies)
                    Assert.That(reply.FinishReason == FinishReason.Stop || reply.FinishReason == FinishReason.Length, said);
            }
            Assert.IsNotEmpty(talks[0].Replies[0].Text.Trim(), said);
        }
    }
}
#endif
