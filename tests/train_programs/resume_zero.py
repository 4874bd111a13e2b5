"""Save training state under one ZeRO stage and world size, resume under another.

    mpiexec -n 2 python resume_zero.py save DIR 3     # 3 Adam steps under stage 3, save,
                                                      # then 2 more steps
    mpiexec -n 3 python resume_zero.py resume DIR 1   # load under stage 1: same 2 losses

Stage ``0`` is plain data parallelism, ``b`` DP with gradient buckets. ``resume`` builds
the model with another seed (only the loaded state can make it right), loads, runs steps
4 and 5 and checks both losses (step 5 depends on the Adam moments and step count)
within 1e-12 relative. Prints RESUME OK (or SAVED).
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np

import sbpmpi as sm

S = sm.sbp.split


class Net(sm.nn.Module):
    def __init__(self, pl: sm.Placement) -> None:
        self.fc1 = sm.nn.Linear(8, 12, placement=pl, dtype=np.float64)
        self.fc2 = sm.nn.Linear(12, 5, placement=pl, dtype=np.float64)

    def forward(self, x):
        return self.fc2(sm.nn.relu(self.fc1(x)))


def step(net, opt, pl: sm.Placement, k: int) -> float:
    rng = np.random.default_rng(k)
    xv, yv = rng.standard_normal((20, 8)), rng.integers(0, 5, size=20)
    opt.zero_grad()
    loss = sm.nn.cross_entropy(net(sm.tensor(xv, placement=pl, sbp=S(0))), yv)
    loss.backward()
    opt.step()
    return loss.item()


def main() -> None:
    mode, directory, stage = sys.argv[1:4]
    sm.manual_seed(1 if mode == "save" else 99)
    pl = sm.placement("cpu", list(range(sm.env.get_world_size())))
    net = Net(pl)
    opt = sm.optim.Adam(net.parameters(), lr=0.05, weight_decay=0.01)
    model: object = net
    if stage == "b":
        model = sm.nn.DataParallel(net)
    elif stage != "0":
        model, opt = sm.nn.shard(net, opt, stage=int(stage))
    state = os.path.join(directory, "state")
    if mode == "save":
        for k in range(3):
            step(model, opt, pl, k)
        sm.checkpoint.save_training_state(state, net if stage == "b" else model, opt)
        losses = [step(model, opt, pl, 3), step(model, opt, pl, 4)]
        if sm.env.get_rank() == 0:
            with open(os.path.join(directory, "expected.json"), "w") as f:
                json.dump(losses, f)
    else:
        sm.checkpoint.load_training_state(state, net if stage == "b" else model, opt)
        losses = [step(model, opt, pl, 3), step(model, opt, pl, 4)]
        with open(os.path.join(directory, "expected.json")) as f:
            want = json.load(f)
        np.testing.assert_allclose(losses, want, rtol=1e-12)
    if sm.env.get_rank() == 0:
        print("losses", losses)
        print("RESUME OK" if mode == "resume" else "SAVED")


if __name__ == "__main__":
    main()
