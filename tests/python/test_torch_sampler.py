"""braid.torch.ReorderingBatchSampler and braid.torch.Groups on real gloo processes:
every rank computes the same sample assignment without communicating, the union of the
ranks' samples is each global batch (each sample once), and the torch groups follow
braid's groups on every rank. A replica out of range or another global batch than the
plan's is refused.

Environment: BRAID_LIBRARY, BRAID_SOURCE_DIR, PYTHONPATH with integrations/python.
"""

import os
import tempfile
import unittest

from _models import TORCH_REASON as REASON
from _models import dist, mp, torch

SOURCE_DIR = os.environ.get("BRAID_SOURCE_DIR") or os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
RUN = os.path.join(SOURCE_DIR, "configs", "runs", "tiny-mllm-4px.yaml")
DATASET = 48


def sizes(index):
    """Skewed sample sizes, so that reordering has something to balance."""
    return {"image_resolution": 16 + (index * 7) % 17, "text_tokens": 4 + (index * 5) % 9}


def worker(rank, world, init_file, results):
    import braid
    import braid.torch as bt

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    plan = braid.Config.from_file(RUN).plan(strategy="disttrain")
    groups = bt.Groups(plan.groups(world))
    # Every rank's torch group of each braid group has the members braid lists.
    for name, ranks in ((g.name, tuple(g.ranks)) for g in plan.groups(world).groups):
        assert groups.ranks(name) == ranks, name
    me = plan.program().rank(rank)
    module = plan.modules[plan.program().stages[me.stage].parts[0].module].name
    global_batch = plan.config.run_settings.global_batch
    # Every rank computes every replica's microbatches; they must agree everywhere.
    table = {}
    for replica in range(plan.program().stages[me.stage].replicas):
        sampler = bt.ReorderingBatchSampler(plan, DATASET, sizes, module, replica, global_batch, shuffle=True, seed=3)
        table[replica] = list(sampler)
    results[rank] = {"module": module, "table": table, "global_batch": global_batch}
    dist.barrier()
    dist.destroy_process_group()


@unittest.skipIf(torch is None, REASON)
class SamplerYieldsTheRunOrder(unittest.TestCase):

    def test_microbatches_come_in_the_order_their_pipeline_runs_them(self):
        import random

        import braid
        import braid.torch as bt

        config = braid.Config.from_file(os.path.join(SOURCE_DIR, "configs", "runs", "tiny-mllm.yaml"))
        plan = config.plan(strategy="disttrain")
        batch = config.run_settings.global_batch
        draw = random.Random(5)  # skewed sizes whose best 1F1B order is not the sample order
        res = [draw.choice([16, 16, 16, 24, 32]) for _ in range(batch)]
        tok = [draw.choice([2, 4, 12]) for _ in range(batch)]
        answer = plan.reorder(image_resolution=res, text_tokens=tok, reordering="intra_inter")
        self.assertTrue(any(list(o) != sorted(o) for o in answer.orders), "a case with an order to keep")
        for m in plan.modules:
            for replica in range(m.dp):
                sampler = bt.ReorderingBatchSampler(plan, batch, lambda i: {"image_resolution": res[i],
                                                                           "text_tokens": tok[i]},
                                                    m.name, replica, batch, reordering="intra_inter")
                got = sampler.assignment(list(range(batch)))
                positions = [{answer.microbatches[i] for i in mb} for mb in got]
                self.assertTrue(all(len(p) == 1 for p in positions), f"{m.name}: a microbatch mixes positions")
                self.assertEqual([p.pop() for p in positions], list(range(len(got))),
                                 f"{m.name} replica {replica}: not in run order")


@unittest.skipIf(torch is None, REASON)
class SamplerRefusesWhatThePlanDoesNotHave(unittest.TestCase):
    """A replica the module does not have, or a global batch other than the plan's (whose
    microbatches would have another size), is a ValueError naming the argument."""

    @classmethod
    def setUpClass(cls):
        import braid

        cls.plan = braid.Config.from_file(RUN).plan(strategy="disttrain")  # vision: 2 replicas, global batch 16

    def sampler(self, **options):
        import braid.torch as bt

        arguments = {"module": "vision", "replica": 0, "global_batch": 16, **options}
        return bt.ReorderingBatchSampler(self.plan, DATASET, sizes, **arguments)

    def test_replica_out_of_range(self):
        for replica in (-1, 2):
            with self.subTest(replica=replica), self.assertRaisesRegex(
                    ValueError, rf"replica {replica} is out of range: module 'vision' has 2 data-parallel replicas"):
                self.sampler(replica=replica)

    def test_global_batch_other_than_the_plans(self):
        self.assertEqual(len(self.sampler()), DATASET // 16 * 2)  # 2 microbatches per global batch
        for batch in (0, 8, 32):
            with self.subTest(global_batch=batch), self.assertRaisesRegex(
                    ValueError, rf"global_batch {batch} is not the plan's 16"):
                self.sampler(global_batch=batch)

    def test_a_dataset_smaller_than_a_batch_yields_nothing(self):
        # len() asked for the sizes of a whole batch, past the dataset's end (an IndexError).
        import braid.torch as bt

        small = bt.ReorderingBatchSampler(self.plan, 10, lambda i: sizes(range(10)[i]), "vision", 0, 16)
        self.assertEqual((len(small), list(small)), (0, []))

    def test_a_module_the_reordering_does_not_place_is_refused(self):
        # A colocated encoder's replicas take their llm replica's samples: it raised a KeyError
        # when iterated.
        import braid
        import braid.torch as bt

        optimus = braid.Config.from_file(RUN).plan(strategy="optimus")
        with self.assertRaisesRegex(ValueError, r"braid's reordering places no samples on module 'vision' of this plan "
                                                r"\(it places projector, llm;"):
            bt.ReorderingBatchSampler(optimus, DATASET, sizes, "vision", 0, 16)
        self.assertGreater(len(bt.ReorderingBatchSampler(optimus, DATASET, sizes, "llm", 0, 16)), 0)


@unittest.skipIf(torch is None, REASON)
class SamplerAgreesEverywhere(unittest.TestCase):

    def test_same_assignment_on_every_rank_and_each_sample_once(self):
        world = 4
        with tempfile.TemporaryDirectory() as tmp:
            results = mp.Manager().dict()
            mp.spawn(worker, args=(world, os.path.join(tmp, "init"), results), nprocs=world, join=True)
            results = dict(results)
        by_module = {}
        for rank, got in results.items():
            by_module.setdefault(got["module"], []).append(got["table"])
        for module, tables in by_module.items():
            for table in tables[1:]:
                self.assertEqual(table, tables[0], f"ranks of {module} disagree")
            table = tables[0]
            samples = sorted(i for microbatches in table.values() for mb in microbatches for i in mb)
            global_batch = results[0]["global_batch"]
            self.assertEqual(samples, list(range(DATASET // global_batch * global_batch)),
                             f"{module}: the replicas' microbatches do not cover the epoch once")
            # Each global batch is split over the replicas: equal sample counts per replica.
            counts = {r: sum(len(mb) for mb in mbs) for r, mbs in table.items()}
            self.assertEqual(len(set(counts.values())), 1, f"{module}: unequal shares {counts}")


if __name__ == "__main__":
    unittest.main(verbosity=2)
