"""Train a ResNet-34 on CIFAR-100 on every visible GPU, keeping the weights of the best epoch."""
import argparse
import os

import torch
import torch.nn as nn
import torchvision
import torchvision.transforms as T


def evaluate(net, loader, device):
    net.eval()
    correct = 0
    with torch.no_grad():
        for images, labels in loader:
            correct += (net(images.to(device)).argmax(1) == labels.to(device)).sum().item()
    return correct / len(loader.dataset)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=200)
    parser.add_argument("--checkpoint-dir", default="checkpoint")
    parser.add_argument("--resume", help="the best.pth of an earlier run")
    args = parser.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"

    transform = T.Compose([T.RandomCrop(32, padding=4), T.RandomHorizontalFlip(), T.ToTensor()])
    train_set = torchvision.datasets.CIFAR100("./data", train=True, download=True, transform=transform)
    test_set = torchvision.datasets.CIFAR100("./data", train=False, download=True, transform=T.ToTensor())
    train_loader = torch.utils.data.DataLoader(train_set, batch_size=128, shuffle=True, num_workers=4)
    test_loader = torch.utils.data.DataLoader(test_set, batch_size=256, num_workers=4)

    net = torchvision.models.resnet34(num_classes=100)
    if args.resume:
        net.load_state_dict(torch.load(args.resume, map_location="cpu"))
    if torch.cuda.device_count() > 1:
        print(f"Using {torch.cuda.device_count()} GPUs")
        net = nn.DataParallel(net)
    net = net.to(device)
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-4)

    best_acc = 0.0
    os.makedirs(args.checkpoint_dir, exist_ok=True)
    for epoch in range(args.epochs):
        net.train()
        for images, labels in train_loader:
            optimizer.zero_grad()
            loss = criterion(net(images.to(device)), labels.to(device))
            loss.backward()
            optimizer.step()
        acc = evaluate(net, test_loader, device)
        if acc > best_acc:
            best_acc = acc
            torch.save(net.state_dict(), os.path.join(args.checkpoint_dir, "best.pth"))  # best so far


if __name__ == "__main__":
    main()
