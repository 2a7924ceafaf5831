from trainer.cli import train

if __name__ == "__main__":
    train(prog_name="python -m trainer")
