"""Train a small CNN on scikit-learn's bundled 8x8 digits images on one device (plain PyTorch, no ddpkit).

    python examples/plain/digits.py
    ddpkit port examples/plain/digits.py -o digits_ddp.py    # the same script, ported to ddpkit

Prints one JSON line at the end: test_accuracy, test_loss, epochs.
"""

import argparse
import json

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=25, help="passes over the training set")
    p.add_argument("--batch-size", type=int, default=64, help="samples per optimizer step")
    p.add_argument("--lr", type=float, default=2e-3, help="Adam learning rate")
    p.add_argument("--seed", type=int, default=0, help="seed of model init, data order and split")
    p.add_argument("--save", default="", help="write the trained weights here ('' for none)")
    return p.parse_args(argv)


def digits_datasets(seed):
    """1797 real 8x8 grey images of handwritten digits, split 80/20 stratified, scaled to [0, 1]."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    x, y = load_digits(return_X_y=True)
    x_train, x_test, y_train, y_test = train_test_split(x, y, test_size=0.2, random_state=seed, stratify=y)

    def as_dataset(xs, ys):
        images = torch.tensor(xs, dtype=torch.float32).view(-1, 1, 8, 8) / 16.0
        return TensorDataset(images, torch.tensor(ys, dtype=torch.long))

    return as_dataset(x_train, y_train), as_dataset(x_test, y_test)


def make_model():
    return nn.Sequential(
        nn.Conv2d(1, 32, 3, padding=1), nn.ReLU(),
        nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(64 * 4 * 4, 128), nn.ReLU(), nn.Dropout(0.2), nn.Linear(128, 10),
    )


def evaluate(model, test_loader, device):
    model.eval()
    loss_sum, correct, count = 0.0, 0, 0
    with torch.no_grad():
        for x, y in test_loader:
            x, y = x.to(device), y.to(device)
            logits = model(x)
            loss_sum += nn.functional.cross_entropy(logits, y, reduction="sum").item()
            correct += (logits.argmax(1) == y).sum().item()
            count += len(y)
    model.train()
    return {"test_loss": loss_sum / count, "test_accuracy": correct / count}


def main(argv=None):
    args = parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(args.seed)
    train_set, test_set = digits_datasets(args.seed)
    train_loader = DataLoader(train_set, batch_size=args.batch_size, shuffle=True, drop_last=True)
    test_loader = DataLoader(test_set, batch_size=256)
    model = make_model().to(device)
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=args.epochs * len(train_loader))
    for epoch in range(args.epochs):
        for x, y in train_loader:
            x, y = x.to(device), y.to(device)
            loss = nn.functional.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
    metrics = evaluate(model, test_loader, device)
    result = {**metrics, "epochs": args.epochs}
    print(json.dumps(result))
    if args.save:
        torch.save(model.state_dict(), args.save)
    return result


if __name__ == "__main__":
    main()
