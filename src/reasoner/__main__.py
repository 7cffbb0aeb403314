from reasoner.cli import app

if __name__ == "__main__":  # the verifier pool's workers re-import the main module
    app(prog_name="reasoner")
