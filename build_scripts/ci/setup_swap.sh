#!/usr/bin/env bash
# _build.yml "Set up swap" (GitHub-hosted runners only): 10 GiB, so a large nvcc link is not killed.
set -euo pipefail

sudo swapoff -a
sudo rm -f /swapfile
sudo fallocate -l 10G /swapfile
sudo chmod 600 /swapfile
sudo mkswap /swapfile
sudo swapon /swapfile
swapon --show
