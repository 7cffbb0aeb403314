from reasoner.cli import run

if __name__ == "__main__":  # the verifier pool's workers re-import the main module
    run()
