"""Process groups through the binding (braid/groups.h): on monolithic, disaggregated
(chain and branches) and colocated plans, every rank is in exactly one tp, one dp and
one pp group of each module it holds and in none of the others; groups come in the
same order from every handle; a rank's stage, replica and tp rank are those of every
program of the plan; links pair producer and consumer replicas by the fan-in/out rule;
batch-sync groups hold every replica of every tower's last stage.

Environment: BRAID_LIBRARY (the libbraid.so to test; required).
"""

import gc
import json
import unittest

from _support import CLIP, MLLM, braid, llava_config
from _support import require_library as setUpModule  # noqa: F401


def check_membership(test, plan, groups):
    """Every rank: one group per axis of each module it holds, none of the others."""
    modules = plan.modules
    by_rank = {}  # (rank, module, axis) -> groups holding it
    for g in groups.groups:
        test.assertIn(g.axis, braid.vocab.axes())
        test.assertEqual(list(g.ranks), sorted(set(g.ranks)), g.name)
        test.assertTrue(g.name.startswith(modules[g.module].name + "." + g.axis), g.name)
        size = getattr(modules[g.module], g.axis)
        test.assertEqual(len(g.ranks), size, g.name)
        for r in g.ranks:
            by_rank.setdefault((r, g.module, g.axis), []).append(g.name)
    for rank in range(groups.world_size):
        info = groups.rank(rank)
        held = {h.module for h in info.holdings}
        test.assertTrue(held, rank)
        for m in range(len(modules)):
            for axis in braid.vocab.axes():
                found = by_rank.get((rank, m, axis), [])
                test.assertEqual(len(found), 1 if m in held else 0, (rank, modules[m].name, axis, found))
        for h in info.holdings:
            module = modules[h.module]
            test.assertTrue(0 <= h.stage < module.pp and 0 <= h.tp < module.tp and 0 <= h.dp < module.dp, h)


class MonolithicGroupsTest(unittest.TestCase):
    """LLaVA-13B, megatron tp=8 pp=4 on 32 ranks: the encoder and the llm on one grid."""

    @classmethod
    def setUpClass(cls):
        cls.config = llava_config()
        cls.plan = cls.config.plan("megatron", tp=8, pp=4)
        cls.groups = cls.plan.groups(32)

    @classmethod
    def tearDownClass(cls):
        cls.groups.close()
        cls.plan.close()
        cls.config.close()

    def test_world(self):
        self.assertEqual(self.groups.world_size, 32)
        self.assertIsInstance(self.groups.groups[0], braid.records.Group)
        self.assertIn("32 ranks", repr(self.groups))

    def test_every_rank_in_one_group_per_axis_of_each_held_module(self):
        check_membership(self, self.plan, self.groups)

    def test_tp_groups_are_consecutive_ranks(self):
        for g in self.groups.groups:
            if g.axis == "tp":
                self.assertEqual(list(g.ranks), list(range(g.ranks[0], g.ranks[0] + 8)), g.name)

    def test_same_order_from_every_handle(self):
        with self.plan.groups() as again, braid.Groups(self.plan, 32) as third:
            self.assertEqual(again.groups, self.groups.groups)
            self.assertEqual(third.groups, self.groups.groups)
            self.assertEqual([again.rank(r) for r in range(32)], [self.groups.rank(r) for r in range(32)])
        with self.config.plan("megatron", tp=8, pp=4) as other, other.groups() as theirs:
            self.assertEqual(theirs.groups, self.groups.groups)

    def test_ranks_run_the_stage_their_programs_say(self):
        for schedule in ("1f1b", "gpipe"):
            with self.plan.program(schedule) as program:
                for rank in range(32):
                    info, mine = self.groups.rank(rank), program.rank(rank)
                    self.assertEqual((info.stage, info.replica, info.tp_rank), (mine.stage, mine.replica, mine.tp_rank))

    def test_records_are_plain_data(self):
        doc = json.loads(json.dumps([g._asdict() for g in self.groups.groups]))
        self.assertEqual(doc[0]["ranks"], list(self.groups.groups[0].ranks))
        self.assertEqual(self.groups.rank(0)._asdict()["holdings"][0]["module"], self.groups.rank(0).holdings[0].module)

    def test_bad_world_and_ranks(self):
        with self.assertRaises(braid.InvalidArgumentError) as cm:
            self.plan.groups(31)
        self.assertIn("31", str(cm.exception))
        self.assertIn("32", str(cm.exception))
        with self.assertRaises(braid.InvalidArgumentError):
            self.groups.rank(32)
        with self.assertRaises(braid.InvalidArgumentError):
            self.groups.rank(-1)
        with self.assertRaises(braid.InvalidArgumentError):
            self.plan.groups("32")

    def test_outlives_the_plan_and_closes(self):
        config = llava_config()
        p = config.plan("megatron", tp=8, pp=4)
        groups = p.groups()
        p.close()
        config.close()
        del p, config
        gc.collect()
        self.assertEqual(groups.groups, self.groups.groups)
        groups.close()
        groups.close()
        self.assertTrue(groups.closed)
        with self.assertRaises(braid.InvalidArgumentError):
            groups.groups
        with self.assertRaises(braid.InvalidArgumentError):
            groups.rank(0)


class ChainLinksTest(unittest.TestCase):
    """LLaVA-13B, disttrain: encoder, projector and llm on their own ranks, one pipeline."""

    def test_links_follow_the_fan_in_rule(self):
        with llava_config() as config, config.plan("disttrain") as p, p.groups() as groups:
            check_membership(self, p, groups)
            modules = p.modules
            links = groups.links
            self.assertTrue(links)
            for link in links:
                self.assertIsInstance(link, braid.records.Link)
                src, dst = modules[link.from_module], modules[link.to_module]
                self.assertEqual((link.from_stage, link.to_stage), (src.pp - 1, 0))
                a, b = src.dp, dst.dp
                self.assertEqual(len(link.pairs), max(a, b))
                for pair in link.pairs:
                    if a >= b:
                        self.assertEqual(pair.to_replica, pair.from_replica // (a // b))
                    else:
                        self.assertEqual(pair.to_replica // (b // a), pair.from_replica)
                    self.assertEqual(len(pair.from_ranks), src.tp)
                    self.assertEqual(len(pair.to_ranks), dst.tp)
                    self.assertEqual(link.local, pair.from_ranks == pair.to_ranks)
            self.assertEqual(groups.batch_syncs, ())


class BatchSyncGroupsTest(unittest.TestCase):
    """CLIP ViT-L/14 on 64 ranks, distmm: two towers joined by one contrastive loss."""

    def test_batch_sync_holds_every_replica_of_every_tower(self):
        with braid.Config.from_file(CLIP) as config, config.plan("distmm") as p, p.groups() as groups, \
                p.program("distmm-pipe") as program:
            check_membership(self, p, groups)
            self.assertEqual(len(groups.batch_syncs), 1)
            sync = groups.batch_syncs[0]
            self.assertIsInstance(sync, braid.records.BatchSync)
            self.assertTrue(sync.name.endswith(".batch_sync"))
            modules = p.modules
            self.assertEqual(len(sync.members), sum(m.dp for m in modules))
            ranks = []
            for member in sync.members:
                module = modules[member.module]
                self.assertEqual(member.stage, module.pp - 1)
                self.assertEqual(len(member.ranks), module.tp)
                ranks.extend(member.ranks)
            self.assertEqual(sync.ranks, tuple(ranks))
            # Every rank that runs a BatchSync is in the group.
            for rank in range(groups.world_size):
                runs_sync = any(i.opcode == "BatchSync" for i in program.rank(rank).instructions)
                self.assertEqual(runs_sync, rank in sync.ranks, rank)


class ColocatedGroupsTest(unittest.TestCase):
    """MLLM-72B on 1024 ranks, optimus: every rank holds encoder and llm state (the
    projector and the generator sit on the llm's first and last stages)."""

    def test_every_rank_holds_the_encoder_and_the_llm(self):
        with braid.Config.from_file(MLLM) as config, config.plan("optimus") as p, p.groups() as groups:
            self.assertEqual(groups.world_size, p.estimate.devices)
            check_membership(self, p, groups)
            everywhere = {m for m, module in enumerate(p.modules) if module.role in ("encoder", "llm")}
            self.assertEqual(len(everywhere), 2)
            for rank in range(groups.world_size):
                self.assertLessEqual(everywhere, {h.module for h in groups.rank(rank).holdings}, rank)


if __name__ == "__main__":
    unittest.main()
