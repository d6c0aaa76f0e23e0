"""Fine-tune a pretrained VGG-16 on a folder of images with every GPU of the machine; the features stay frozen."""
import argparse

import torch
import torch.nn as nn
import torchvision
import torchvision.transforms as T


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("data")
    parser.add_argument("--classes", type=int, default=10)
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--lr", type=float, default=1e-3)
    args = parser.parse_args()

    transform = T.Compose([T.Resize(256), T.CenterCrop(224), T.ToTensor()])
    dataset = torchvision.datasets.ImageFolder(args.data, transform=transform)
    loader = torch.utils.data.DataLoader(dataset, batch_size=64, shuffle=True, num_workers=8)

    model = torchvision.models.vgg16(weights="IMAGENET1K_V1")
    model.classifier[6] = nn.Linear(4096, args.classes)
    model = nn.DataParallel(model).cuda()

    # Only the classifier learns; the convolutional features keep their ImageNet weights.
    optimizer = torch.optim.SGD(model.module.classifier.parameters(), lr=args.lr, momentum=0.9)
    criterion = nn.CrossEntropyLoss()

    for epoch in range(args.epochs):
        model.train()
        for images, labels in loader:
            images, labels = images.cuda(), labels.cuda()
            optimizer.zero_grad()
            loss = criterion(model(images), labels)
            loss.backward()
            optimizer.step()
        print(f"epoch {epoch}: loss {loss.item():.4f}")
    torch.save(model.module.state_dict(), "vgg16_finetuned.pth")


if __name__ == "__main__":
    main()
