"""`import lcplan` against the CLI: the same records, the same sentences (as ValueError), search pins and lists."""
import json
import os
import subprocess
import tempfile
import unittest

import lcplan

LCPLAN = os.environ.get("LCPLAN_BINARY", "lcplan")
REFERENCE = {
    "model": "qwen3.5-35b-a3b", "gpus": 32, "seq_len": "128k",
    "parallel": {"tp": 1, "pp": 1, "ep": 8, "cp": 4},
    "optimizer_sharding": "fsdp", "recompute": "full", "linear_ce": True,
    "moe": {"ep_chunks": 2}, "implementation": "bumblebee",
}


def cli(*args):
    """Runs the lcplan binary; returns (exit status, stdout, stderr)."""
    r = subprocess.run([LCPLAN, *args], capture_output=True, text=True, check=False)
    return r.returncode, r.stdout, r.stderr


class Estimate(unittest.TestCase):
    def test_reference_plan_is_the_clis_record(self):
        with tempfile.NamedTemporaryFile("w", suffix=".json") as f:
            json.dump(REFERENCE, f)
            f.flush()
            status, out, err = cli("estimate", "--plan", f.name, "--json")
        self.assertEqual(status, 0, err)
        want = json.loads(out)
        got = lcplan.estimate(REFERENCE)
        self.assertEqual(got["memory"]["peak_bytes"], want["memory"]["peak_bytes"])
        self.assertEqual(got, want)  # the whole record, field for field

    def test_plan_file_path_hardware_and_calibration_overrides(self):
        with tempfile.NamedTemporaryFile("w", suffix=".json") as f:
            json.dump(REFERENCE, f)
            f.flush()
            self.assertEqual(lcplan.estimate(f.name), lcplan.estimate(REFERENCE))
            status, out, err = cli("estimate", "--plan", f.name, "--json", "--hardware", "h200", "--calibration", "priors")
        self.assertEqual(status, 0, err)
        self.assertEqual(lcplan.estimate(REFERENCE, hardware="h200", calibration="priors"), json.loads(out))

    def test_bad_plan_raises_value_error_with_the_clis_sentence(self):
        bad = dict(REFERENCE, parallel={"tp": 3, "ep": 8, "cp": 4})
        with self.assertRaises(ValueError) as caught:
            lcplan.estimate(bad)
        message = str(caught.exception)
        self.assertIn("tp = 3", message)
        self.assertNotIn("\n", message)
        status, _, err = cli("estimate", "--model", "qwen3.5-35b-a3b", "--gpus", "32", "--seq", "128k", "--tp", "3",
                             "--ep", "8", "--cp", "4", "--implementation", "bumblebee")
        self.assertEqual(status, 2)
        self.assertEqual(err.strip(), "lcplan: error: " + message)

    def test_wrong_types_are_value_errors(self):
        for plan, word in [(dict(REFERENCE, gpus="many"), "gpus"), (dict(REFERENCE, colour="red"), "colour"),
                           ({**REFERENCE, "gpus": 2**70}, "64 bits"), ({**REFERENCE, "moe": {1: 2}}, "not a string")]:
            with self.assertRaises(ValueError) as caught:
                lcplan.estimate(plan)
            self.assertIn(word, str(caught.exception))
        with self.assertRaises(ValueError):
            lcplan.estimate(42)
        with self.assertRaises(ValueError):
            lcplan.estimate("/no/such/recipe.json")


class Search(unittest.TestCase):
    def test_returns_the_clis_top_list(self):
        got = lcplan.search(model="qwen3.5-35b-a3b", gpus=32, seq="128k", tp=1, ep=[8, 16])
        status, out, err = cli("search", "--model", "qwen3.5-35b-a3b", "--gpus", "32", "--seq", "128k", "--tp", "1",
                               "--ep", "8,16", "--json")
        self.assertEqual(status, 0, err)
        want = json.loads(out)
        self.assertEqual(len(got["top"]), 10)
        self.assertEqual([c["plan"] for c in got["top"]], [c["plan"] for c in want["top"]])
        self.assertEqual(got["top"][0]["time"]["tokens_per_second_per_gpu"], want["top"][0]["time"]["tokens_per_second_per_gpu"])
        self.assertEqual(len(got["pareto"]), len(want["pareto"]))
        for c in got["top"]:
            self.assertEqual(c["plan"]["parallel"]["tp"], 1)
            self.assertIn(c["plan"]["parallel"]["ep"], (8, 16))
        self.assertIn("rationale", got["reduced_recipe"])

    def test_pins_of_every_kind(self):
        got = lcplan.search(model="qwen3.5-35b-a3b", gpus=32, seq=131072, ep=8, cp=4, optimizer_sharding="fsdp",
                            recompute=["full"], linear_ce=True, ep_chunks=[1, 2], top=3, headroom=2.5,
                            implementation="bumblebee")  # chunked EP is bumblebee's and lcplan-exec's
        self.assertEqual(len(got["top"]), 3)
        for c in got["top"]:
            p = c["plan"]
            self.assertEqual((p["parallel"]["ep"], p["parallel"]["cp"], p["optimizer_sharding"], p["recompute"], p["linear_ce"]),
                             (8, 4, "fsdp", "full", True))
            self.assertIn(p["moe"]["ep_chunks"], (1, 2))

    def test_bad_constraints_are_value_errors(self):
        for kwargs, word in [({"tp": 3}, "tp 3 cannot work"), ({"tensor": 2}, "unknown argument \"tensor\""),
                             ({"ep": []}, "empty list"), ({"recompute": "partial"}, "partial"), ({"tp": True}, "whole number"),
                             ({"headroom": 500}, "headroom"), ({"objective": "speed"}, "speed")]:
            with self.assertRaises(ValueError, msg=str(kwargs)) as caught:
                lcplan.search(model="qwen3.5-35b-a3b", gpus=32, seq="128k", **kwargs)
            self.assertIn(word, str(caught.exception))
        with self.assertRaises(ValueError) as caught:
            lcplan.search(model="qwen3.5-35b-a3b", gpus=32)
        self.assertIn("needs seq", str(caught.exception))
        with self.assertRaises(ValueError) as caught:
            lcplan.search(model="deepseek-v3", gpus=8, seq="1M")
        self.assertIn("fits", str(caught.exception))


class Models(unittest.TestCase):
    def test_models_are_the_clis(self):
        status, out, err = cli("models", "--json")
        self.assertEqual(status, 0, err)
        got = lcplan.models()
        self.assertEqual(got, json.loads(out))
        self.assertIn("qwen3.5-35b-a3b", [m["name"] for m in got])


class Validate(unittest.TestCase):
    def test_predicted_against_measured(self):
        plan = dict(REFERENCE)
        measured = lcplan.estimate(plan)
        runs = [{"id": "r1", "source": "test", "plan": plan, "peak_bytes": measured["memory"]["peak_bytes"] * 1.1,
                 "tflops_per_gpu": measured["time"]["tflops_per_gpu"]}]
        v = lcplan.validate(runs)
        q = v["runs"][0]["quantities"]
        self.assertEqual(q["peak_bytes"]["predicted"], measured["memory"]["peak_bytes"])
        self.assertAlmostEqual(q["peak_bytes"]["relative_error"], 1 / 1.1 - 1)
        self.assertAlmostEqual(q["tflops_per_gpu"]["relative_error"], 0.0)
        self.assertAlmostEqual(v["mape"]["peak_bytes"], abs(1 / 1.1 - 1))
        self.assertEqual(v["runs"][0]["calibration"], "default")
        self.assertEqual(v["runs"][0]["implementation"], "bumblebee")

    def test_validation_file_and_bad_records(self):
        root = os.environ.get("LCPLAN_DATA_DIR", ".")
        v = lcplan.validate(os.path.join(root, "data", "validation", "bumblebee-runs.json"))
        self.assertGreater(len(v["runs"]), 5)
        with self.assertRaises(ValueError):
            lcplan.validate([{"id": "x", "plan": REFERENCE}])  # nothing measured
        with self.assertRaises(ValueError):
            lcplan.validate(3)


if __name__ == "__main__":
    unittest.main()
