from fairseq_plugins.cli.plot_curves import main

if __name__ == "__main__":
    main()
