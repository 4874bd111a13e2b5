"""Save training state in one layout and world size, resume in another (test program).

    mpiexec -n 2 python resume.py save DIR dp     # 3 Adam steps, save, then 2 more steps
    mpiexec -n 3 python resume.py resume DIR tp   # load, the same 2 steps: same losses

``save`` writes the losses of steps 4 and 5 to DIR/expected.json; ``resume`` builds the
model with another seed (so only the loaded state can make it right), loads, runs
steps 4 and 5 and checks both losses (step 5 depends on the Adam moments and step
count) within 1e-12 relative. Prints RESUME OK.
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np

import sbpmpi as sm

S, B = sm.sbp.split, sm.sbp.broadcast


def layout(kind: str) -> tuple[sm.Placement, tuple, tuple, tuple]:
    n = sm.env.get_world_size()
    if kind == "2d":
        pl = sm.placement("cpu", np.arange(n).reshape(n // 2, 2).tolist())
        return pl, (S(0), B), (B, S(1)), (B, S(0))
    pl = sm.placement("cpu", list(range(n)))
    if kind == "tp":
        return pl, (B,), (S(1),), (S(0),)
    return pl, (S(0),), (B,), (B,)


class Net(sm.nn.Module):
    def __init__(self, kind: str) -> None:
        pl, self.xs, w1, w2 = layout(kind)
        self.pl = pl
        self.fc1 = sm.nn.Linear(8, 12, placement=pl, sbp=w1, dtype=np.float64)
        self.fc2 = sm.nn.Linear(12, 5, placement=pl, sbp=w2, dtype=np.float64)

    def forward(self, x):
        return self.fc2(sm.nn.relu(self.fc1(x)))


def step(net, opt, k: int) -> float:
    rng = np.random.default_rng(k)
    xv, yv = rng.standard_normal((20, 8)), rng.integers(0, 5, size=20)
    x = sm.tensor(xv, placement=net.pl, sbp=net.xs)
    opt.zero_grad()
    loss = sm.nn.cross_entropy(net(x), yv)
    loss.backward()
    opt.step()
    return loss.item()


def main() -> None:
    mode, directory, kind = sys.argv[1:4]
    sm.manual_seed(1 if mode == "save" else 99)
    net = Net(kind)
    opt = sm.optim.Adam(net.parameters(), lr=0.05, weight_decay=0.01)
    state = os.path.join(directory, "state")
    if mode == "save":
        for k in range(3):
            step(net, opt, k)
        sm.checkpoint.save_training_state(state, net, opt)
        losses = [step(net, opt, 3), step(net, opt, 4)]
        if sm.env.get_rank() == 0:
            with open(os.path.join(directory, "expected.json"), "w") as f:
                json.dump(losses, f)
    else:
        sm.checkpoint.load_training_state(state, net, opt)
        losses = [step(net, opt, 3), step(net, opt, 4)]
        with open(os.path.join(directory, "expected.json")) as f:
            want = json.load(f)
        np.testing.assert_allclose(losses, want, rtol=1e-12)
    if sm.env.get_rank() == 0:
        print("losses", losses)
        print("RESUME OK" if mode == "resume" else "SAVED")


if __name__ == "__main__":
    main()
